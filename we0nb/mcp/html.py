"""The HTML of an :class:`~we0nb.MCPServer` in a notebook: its tools and their effective policies."""

from __future__ import annotations

from .endpoint import Endpoint

__all__ = ["server_html"]


def server_html(server: Endpoint) -> str:
    from ..notebook.html import esc, wrap  # the notebook layer, imported only when rendering

    head = (f"<div><span class='we0-role'>{esc(server.label)}</span> "
            f"<span class='we0-muted'>{esc(server.kind)}, {'connected' if server.connected else 'not connected'}"
            f"{', annotations trusted' if server.options.trust_annotations else ''}</span></div>")
    try:
        rows = server.policy_table()
    except RuntimeError:
        return wrap(head + "<div class='we0-muted'>Tools not listed yet: <code>await server.connect()</code>.</div>")
    cols = ("tool", "side_effects", "blocks_on_error", "requires_approval", "why", "read_only_hint",
            "destructive_hint")
    body = "".join("<tr>" + "".join(f"<td>{'<code>' + esc(r[c]) + '</code>' if c == 'tool' else esc(r[c])}</td>"
                                    for c in cols) + "</tr>" for r in rows)
    table = ("<table class='we0-tools'><thead><tr>" + "".join(f"<th>{esc(c)}</th>" for c in cols)
             + f"</tr></thead><tbody>{body}</tbody></table>")
    return wrap(head + table)
