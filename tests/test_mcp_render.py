"""Attachments of tool calls (MCP images, audio, links) in the transcript HTML: shown, and safe."""

from __future__ import annotations

from we0nb.messages import Attachment, ToolPart, ToolStateCompleted, ToolTime
from we0nb.notebook.html import render_html


def part(*attachments: Attachment) -> ToolPart:
    state = ToolStateCompleted(input={}, output="a red dot", time=ToolTime(start=1.0, end=2.0),
                               attachments=list(attachments))
    return ToolPart(id="prt_1", session_id="ses_1", message_id="msg_1", call_id="c1", tool="picture", state=state)


def test_images_audio_and_links_render_inline() -> None:
    html = render_html(part(Attachment(type="image", mime_type="image/png", data="iVBORw0KGgo="),
                            Attachment(type="audio", mime_type="audio/wav", data="UklGRg=="),
                            Attachment(type="link", uri="https://example.org/r.pdf", name="report <1>")))
    assert "<img src='data:image/png;base64,iVBORw0KGgo='" in html
    assert "<audio controls src='data:audio/wav;base64,UklGRg=='>" in html
    assert "<a href='https://example.org/r.pdf' target='_blank' rel='noopener noreferrer'>report &lt;1&gt;</a>" in html


def test_unsafe_attachments_are_shown_as_text_only() -> None:
    html = render_html(part(Attachment(type="link", uri="javascript:alert(1)", name="x"),
                            Attachment(type="image", mime_type="text/html", data="PHNjcmlwdD4="),
                            Attachment(type="image", mime_type="image/png", data="'><script>alert(1)</script>")))
    assert "href='javascript" not in html and "<script>" not in html
    assert "data:text/html" not in html
    assert html.count("<img") == 0
