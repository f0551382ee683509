"""The HTML of an :class:`~we0nb.MCPServer` in a notebook: its tools and their effective policies.

Self-contained on purpose: the MCP layer stands below the notebook layer and must not import
it, so this small table carries its own escaping and inline styles (which survive the
sanitiser of an untrusted notebook) and the ``we0`` classes the notebook's stylesheet knows.
"""

from __future__ import annotations

import html as _html
from typing import Any

from .endpoint import Endpoint

__all__ = ["server_html"]

_COLS = ("tool", "side_effects", "idempotent", "blocks_on_error", "requires_approval", "why", "read_only_hint",
         "destructive_hint", "idempotent_hint")
_CELL = "border:1px solid #bdbdbd;padding:2px 6px;text-align:left;vertical-align:top"
_MUTED = "color:#757575;font-size:11px"


def _esc(value: Any) -> str:
    return _html.escape("" if value is None else str(value), quote=True)


def server_html(server: Endpoint) -> str:
    state = "connected" if server.connected else "not connected"
    trusted = ", annotations trusted" if server.options.trust_annotations else ""
    head = (f"<div><span class='we0-role' style='font-weight:600'>{_esc(server.label)}</span> "
            f"<span class='we0-muted' style='{_MUTED}'>{_esc(server.kind)}, {state}{trusted}</span></div>")
    try:
        rows = server.policy_table()
    except RuntimeError:
        note = "Tools not listed yet: <code>await server.connect()</code>."
        return f"<div class='we0'>{head}<div class='we0-muted' style='{_MUTED}'>{note}</div></div>"
    cells = []
    for r in rows:
        tds = "".join(f"<td style='{_CELL}'>{'<code>' + _esc(r.get(c)) + '</code>' if c == 'tool' else _esc(r.get(c))}"
                      "</td>" for c in _COLS)
        cells.append(f"<tr>{tds}</tr>")
    hidden = getattr(server, "hidden_tools", {})
    note = "".join(f"<div class='we0-muted' style='{_MUTED}'>not offered: <code>{_esc(n)}</code> ({_esc(why)})</div>"
                   for n, why in hidden.items())
    table = ("<table class='we0-tools' style='border-collapse:collapse'><thead><tr>"
             + "".join(f"<th style='{_CELL}'>{_esc(c)}</th>" for c in _COLS)
             + f"</tr></thead><tbody>{''.join(cells)}</tbody></table>")
    return f"<div class='we0'>{head}{table}{note}</div>"
