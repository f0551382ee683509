"""Revert: hide a message and everything after it, undo that, and the views that honour it.

A session's ``revert`` (:class:`~we0nb.messages.SessionRevert`) holds the message it was
reverted to and when. A message is **hidden** when it is that message or a later one
(ids sort in creation order) *and* it was created before the revert was made — so
messages that a ``mode="resume"`` run writes while the revert stands stay visible.

* hidden messages are never sent to the model and are left out of
  ``agent.transcript()`` unless ``include_reverted=True`` (then every message is a
  :class:`MarkedMessage` whose ``reverted`` says whether it is hidden);
* ``mode="prompt"`` deletes the hidden messages for good and clears the revert;
* ``mode="resume"`` leaves the revert as it is and works on the visible messages only;
* :func:`unrevert` clears the revert: the hidden messages come back — unless a resume wrote
  messages while the revert stood (they would sit beside the hidden ones as a second branch:
  refused, nothing changed).

Revert and unrevert take the session lease for the moment they write, so they are
refused (:class:`~we0nb.SessionBusyError`) while a run is in progress.
"""

from __future__ import annotations

from typing import Optional, Sequence

from .._ids import new_id, now
from ..messages import MessageWithParts, Session, SessionRevert, Transcript, assembled
from ..persistence.base import MessageInfo, Persistence
from .request import check_session_id

__all__ = ["MarkedMessage", "is_hidden", "hides", "hidden_ids", "visible_messages", "mark_transcript",
           "revert_session", "unrevert_session"]


class MarkedMessage(MessageWithParts):
    """A transcript message with ``reverted`` telling whether a revert hides it."""

    reverted: bool = False


def is_hidden(revert: Optional[SessionRevert], info: MessageInfo) -> bool:
    """Whether ``revert`` hides the message ``info``."""
    return hides(revert, info.id, info.time.created)


def hides(revert: Optional[SessionRevert], message_id: str, created: float) -> bool:
    """Whether ``revert`` hides the message ``message_id`` created at ``created``: the rule, once."""
    if revert is None:
        return False
    return message_id >= revert.message_id and created <= revert.time


def hidden_ids(session: Optional[Session], messages: Sequence[MessageWithParts]) -> list[str]:
    rev = session.revert if session is not None else None
    return [m.info.id for m in messages if is_hidden(rev, m.info)]


def visible_messages(session: Optional[Session], messages: list[MessageWithParts]) -> list[MessageWithParts]:
    """``messages`` without the hidden ones (the same list object when nothing is hidden)."""
    rev = session.revert if session is not None else None
    if rev is None:
        return messages
    return [m for m in messages if not is_hidden(rev, m.info)]


def mark_transcript(transcript: Transcript, include_reverted: bool = False) -> Transcript:
    """The transcript as users see it: hidden messages dropped, or all kept and marked."""
    rev = transcript.session.revert if transcript.session is not None else None
    if include_reverted:
        marked = [assembled(MarkedMessage, info=m.info, parts=m.parts, reverted=is_hidden(rev, m.info))
                  for m in transcript.messages]
        return assembled(Transcript, session=transcript.session, messages=marked)
    if rev is None:
        return transcript
    return assembled(Transcript, session=transcript.session,
                     messages=visible_messages(transcript.session, transcript.messages))


async def revert_session(persistence: Persistence, session_id: str, message_id: str) -> Session:
    """Hide ``message_id`` and every later message of ``session_id``; returns the session."""
    check_session_id(session_id, "revert(session_id)")
    if not isinstance(message_id, str):
        raise TypeError("revert(session_id, message_id): message_id must be a string.")
    lease = await persistence.acquire_lease(session_id, new_id("run"))  # refused while a run is on
    try:
        transcript = await persistence.load_transcript(session_id)
        session = transcript.session
        if session is None:
            raise ValueError(f"revert(): session {session_id!r} does not exist.")
        if not any(m.info.id == message_id for m in transcript.messages):
            raise ValueError(
                f"revert(): message {message_id!r} is not in session {session_id!r}; pass the id of "
                "one of its messages (see agent.transcript(session_id, include_reverted=True))."
            )
        session.revert = SessionRevert(message_id=message_id, time=now())
        await persistence.upsert_session(session)
        await persistence.flush()
        return session
    finally:
        await lease.release()


async def unrevert_session(persistence: Persistence, session_id: str) -> Session:
    """Undo the revert of ``session_id`` (no-op when there is none); returns the session."""
    check_session_id(session_id, "unrevert(session_id)")
    lease = await persistence.acquire_lease(session_id, new_id("run"))  # refused while a run is on
    try:
        session = await persistence.get_session(session_id)
        if session is None:
            raise ValueError(f"unrevert(): session {session_id!r} does not exist.")
        rev = session.revert
        if rev is not None:
            transcript = await persistence.load_transcript(session_id)
            since = [m for m in transcript.messages if m.info.id >= rev.message_id and m.info.time.created > rev.time]
            if since:
                raise ValueError(
                    f"unrevert(): session {session_id!r} was resumed after its revert ({len(since)} message(s) "
                    "written since): the hidden messages would come back beside them as a second branch. Nothing "
                    "was changed; the hidden messages stay readable with agent.transcript(session_id, "
                    "include_reverted=True).")
            session.revert = None
            await persistence.upsert_session(session)
            await persistence.flush()
        return session
    finally:
        await lease.release()
