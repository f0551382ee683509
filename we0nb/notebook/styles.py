"""The look of every we0nb output: a scoped ``<style>`` block, and inline styles that survive sanitising.

Trusted outputs use :data:`CSS` (JupyterLab's CSS variables, so light and dark themes both
read well). A notebook opened untrusted (a fresh clone, Binder) has its HTML sanitised by
JupyterLab: ``<style>`` blocks and CSS variables are dropped, while ``class`` and ``style``
attributes with plain values are kept. So :func:`inline_styles` gives every element of our
markup an inline ``style`` (:data:`INLINE`) made only of what that sanitiser keeps — plain
colours, borders, padding, opacity, ``white-space`` — with values that read on light and
dark backgrounds.
"""

from __future__ import annotations

import html
import re

from .part_text import visible

__all__ = ["CSS", "STYLE", "INLINE", "inline_styles", "row_message", "row_border"]

CSS = """
.we0{font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:var(--jp-ui-font-size1,13px);
color:var(--jp-ui-font-color1,#212121);background:var(--jp-layout-color1,transparent);line-height:1.45;max-width:100%}
.we0 .we0-head{display:flex;flex-wrap:wrap;gap:.6em;align-items:baseline;padding:.2em 0 .4em;
border-bottom:1px solid var(--jp-border-color2,#e0e0e0);margin-bottom:.4em}
.we0 .we0-title{font-weight:600}
.we0 .we0-muted{color:var(--jp-ui-font-color2,#757575);font-size:var(--jp-ui-font-size0,11px)}
.we0 code,.we0 .we0-mono{font-family:var(--jp-code-font-family,monospace);font-size:var(--jp-code-font-size,12px)}
.we0 .we0-turn{border-left:3px solid var(--jp-border-color2,#e0e0e0);padding:.2em .6em;margin:.35em 0}
.we0 .we0-user{border-left-color:var(--jp-brand-color1,#1976d2);background:var(--jp-layout-color2,rgba(127,127,127,.06))}
.we0 .we0-assistant{border-left-color:var(--jp-success-color1,#388e3c)}
.we0 .we0-role{font-weight:600;font-size:var(--jp-ui-font-size0,11px);text-transform:uppercase;letter-spacing:.04em;
color:var(--jp-ui-font-color2,#616161);margin-right:.5em}
.we0 .we0-text{white-space:pre-wrap;word-break:break-word;margin:.2em 0}
.we0 details.we0-reasoning{margin:.2em 0;color:var(--jp-ui-font-color2,#616161)}
.we0 details.we0-reasoning>summary{cursor:pointer;font-style:italic}
.we0 .we0-reasoning .we0-text{border-left:2px dotted var(--jp-border-color1,#bdbdbd);padding-left:.5em}
.we0 table.we0-tools{font-size:inherit;border-collapse:collapse;margin:.3em 0;width:100%;table-layout:fixed}
.we0 table.we0-tools th,.we0 table.we0-tools td{border:1px solid var(--jp-border-color2,#e0e0e0);padding:.15em .4em;
text-align:left;vertical-align:top}
.we0 table.we0-tools th{background:var(--jp-layout-color2,rgba(127,127,127,.08));font-weight:600}
.we0 table.we0-tools td.we0-io{white-space:pre-wrap;overflow-wrap:anywhere}
.we0 table.we0-kv td{padding:.05em .6em .05em 0;vertical-align:top}
.we0 .we0-badge{display:inline-block;padding:0 .45em;border-radius:.7em;font-size:var(--jp-ui-font-size0,11px);
font-weight:600;color:#fff;background:var(--jp-ui-font-color3,#9e9e9e);max-width:100%;overflow-wrap:anywhere}
.we0 .we0-s-pending{background:var(--jp-ui-font-color3,#9e9e9e)}
.we0 .we0-s-running{background:var(--jp-brand-color1,#1976d2)}
.we0 .we0-s-completed,.we0 .we0-s-finished,.we0 .we0-s-stop{background:var(--jp-success-color1,#388e3c)}
.we0 .we0-s-error,.we0 .we0-s-failed{background:var(--jp-error-color1,#d32f2f)}
.we0 .we0-s-interrupted,.we0 .we0-s-aborted,.we0 .we0-s-unfinished,.we0 .we0-s-compact{background:var(--jp-warn-color1,#f57c00)}
.we0 .we0-s-idle{background:var(--jp-ui-font-color3,#9e9e9e)}
.we0 .we0-s-awaiting,.we0 .we0-s-approval{background:#7b1fa2}
.we0 .we0-s-denied,.we0 .we0-o-denied{background:#ad1457}
.we0 .we0-o-approved{background:#00796b}
.we0 .we0-note{font-size:var(--jp-ui-font-size0,11px);color:var(--jp-ui-font-color2,#757575)}
.we0 .we0-err,.we0 .we0-note.we0-err{color:var(--jp-error-color1,#d32f2f)}
.we0 .we0-warn,.we0 .we0-note.we0-warn{color:var(--jp-warn-color1,#f57c00)}
.we0 .we0-o-keep{background:#607d8b}
.we0 .we0-id{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.we0 .we0-o-recall{background:var(--jp-brand-color1,#1976d2)}
.we0 .we0-o-in_doubt{background:#c62828}
.we0 .we0-o-never_started{background:#607d8b}
.we0 .we0-o-reconciled{background:#2e7d32}
.we0 .we0-compaction{border:1px dashed var(--jp-border-color1,#bdbdbd);padding:.3em .5em;margin:.3em 0}
.we0 .we0-cursor::after{content:"\\258D";color:var(--jp-brand-color1,#1976d2)}
""".strip()

STYLE = f"<style>{CSS}</style>"

_GREY_LINE = "rgba(128,128,128,0.4)"
#: inline styles by class: only what JupyterLab's sanitiser keeps (no CSS variables), readable on light and dark
INLINE = {
    "we0": "font-size:13px;line-height:1.45",
    "we0-head": f"padding:2px 0 4px;margin-bottom:4px;border-bottom:1px solid {_GREY_LINE}",
    "we0-title": "font-weight:600",
    "we0-muted": "opacity:0.75;font-size:11px",
    "we0-mono": "font-family:monospace",
    "we0-id": "white-space:nowrap;overflow:hidden;text-overflow:ellipsis",
    "we0-turn": f"border-left:3px solid {_GREY_LINE};padding:2px 8px;margin:4px 0",
    "we0-user": "border-left-color:#1976d2",
    "we0-assistant": "border-left-color:#388e3c",
    "we0-role": "font-weight:600;font-size:11px;text-transform:uppercase;letter-spacing:0.5px;opacity:0.8;"
                "margin-right:6px",
    "we0-text": "white-space:pre-wrap;overflow-wrap:break-word;margin:2px 0",
    "we0-tools": "border-collapse:collapse;margin:4px 0;width:100%;table-layout:fixed",
    "we0-cell": f"border:1px solid {_GREY_LINE};padding:2px 6px;text-align:left;vertical-align:top",
    "we0-th": "font-weight:600;background-color:rgba(128,128,128,0.12)",
    "we0-io": "white-space:pre-wrap;overflow-wrap:anywhere",
    "we0-kv": "border-collapse:collapse",
    "we0-badge": "display:inline-block;padding:0 6px;margin:1px 2px 1px 0;border-radius:8px;font-size:11px;"
                 "font-weight:600;color:#ffffff;background-color:#9e9e9e;max-width:100%;overflow-wrap:anywhere",
    "we0-s-running": "background-color:#1976d2",
    "we0-s-completed": "background-color:#388e3c",
    "we0-s-finished": "background-color:#388e3c",
    "we0-s-stop": "background-color:#388e3c",
    "we0-s-error": "background-color:#d32f2f",
    "we0-s-failed": "background-color:#d32f2f",
    "we0-s-interrupted": "background-color:#f57c00",
    "we0-s-aborted": "background-color:#f57c00",
    "we0-s-unfinished": "background-color:#f57c00",
    "we0-s-compact": "background-color:#f57c00",
    "we0-s-awaiting": "background-color:#7b1fa2",
    "we0-s-approval": "background-color:#7b1fa2",
    "we0-s-denied": "background-color:#ad1457",
    "we0-o-denied": "background-color:#ad1457",
    "we0-o-approved": "background-color:#00796b",
    "we0-o-keep": "background-color:#607d8b",
    "we0-o-recall": "background-color:#1976d2",
    "we0-o-in_doubt": "background-color:#c62828",
    "we0-o-never_started": "background-color:#607d8b",
    "we0-o-reconciled": "background-color:#2e7d32",
    "we0-note": "font-size:11px;opacity:0.85",
    "we0-err": "color:#d32f2f",
    "we0-warn": "color:#f57c00",
    "we0-compaction": "border:1px dashed rgba(128,128,128,0.6);padding:4px 6px;margin:4px 0",
}
_TAG = re.compile(r"<([a-z]+)((?: [a-z-]+(?:='[^'<>]*')?)*)>")


def inline_styles(html: str) -> str:
    """Add each element's inline ``style`` (from its classes) so sanitised HTML still reads well.

    Only our own markup is touched: text from models and tools is escaped, so it holds no
    ``<`` or ``'`` that this could match.
    """

    def add(m: "re.Match[str]") -> str:
        cls = re.search(r" class='([^']*)'", m.group(2))
        if cls is None:
            return m.group(0)
        style = ";".join(INLINE[c] for c in cls.group(1).split() if c in INLINE)
        return f"<{m.group(1)}{m.group(2)} style='{style}'>" if style else m.group(0)

    return _TAG.sub(add, html)


def row_message(text: str, error: bool = False) -> str:
    """A widget row's message line (approval, question, fork): ``text`` escaped (controls made visible),
    red for an error."""
    colour = "#d32f2f" if error else "inherit"
    return f"<span style='white-space:normal;color:{colour}'>{html.escape(visible(text))}</span>"


def row_border(accepted: bool) -> str:
    """The border of a widget row once decided: teal when accepted (approved), plum otherwise."""
    return f"1px solid {'#00796b' if accepted else '#ad1457'}"
