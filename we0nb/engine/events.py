"""The event vocabulary of ``We0Agent.stream()``: plain dicts with a ``"type"``.

Parts and messages in events are snapshots (copies), safe to keep.

================  ==================================================================
type              keys
================  ==================================================================
start             session_id, mode ("prompt"/"resume"), run_id
user-message      message (UserMessage), text — prompt mode, once per written message
recovery          action ("keep"/"recall"/"interrupt"), part (ToolPart) — resume, and
                  prompt-mode interrupts; action "close", message (AssistantMessage)
                  when an unfinished assistant message is closed
step-start        step (1-based within the run), message (AssistantMessage, unfinished)
text-start        part (TextPart)
text-delta        text, part_id
text-end          part (TextPart, final text)
reasoning-start   part (ReasoningPart)
reasoning-delta   text, part_id
reasoning-end     part (ReasoningPart)
tool              part (ToolPart) — every tool-state change: pending, running,
                  completed, error (interrupted ones carry metadata["interrupted"])
step-finish       step, message (AssistantMessage, completed), finish_reason, usage
compaction        part (CompactionPart), message (the summary AssistantMessage) — the
                  history was summarised; the run then ends with result "compact"
finish            result (RunResult) — always the last event of a run that ended
================  ==================================================================

An aborted run yields no final event: the iterator raises ``asyncio.CancelledError``.
"""

EVENT_TYPES = (
    "start", "user-message", "recovery", "step-start", "text-start", "text-delta", "text-end",
    "reasoning-start", "reasoning-delta", "reasoning-end", "tool", "step-finish", "compaction", "finish",
)
