"""The pure recovery planner, one test per row of the seed's tables."""

import pytest

from we0nb.engine.recovery import block_after, needs_recovery, plan_recovery
from we0nb.messages import AssistantMessage, MessageTime, ToolPart
from we0nb.tools import ToolPolicy

from enginekit import state

POL = {
    "write": ToolPolicy(side_effects=True),
    "read": ToolPolicy(side_effects=False),
    "strict": ToolPolicy(side_effects=False, blocks_on_error=True),
    "strict_w": ToolPolicy(side_effects=True, blocks_on_error=True),
}


def msg(completed=None):
    return AssistantMessage(id="m", session_id="s", time=MessageTime(created=1.0, completed=completed))


def parts(*spec):
    return [ToolPart(id=f"p{i}", session_id="s", message_id="m", call_id=f"c{i}", tool=t, state=state(st))
            for i, (t, st) in enumerate(spec)]


def actions(plan):
    return [(a.tool, a.action, a.reason) for a in plan.tool_actions]


def test_no_signal_no_action():
    ps = parts(("write", "completed"), ("read", "error"))
    assert not needs_recovery(msg(completed=2.0), ps)
    plan = plan_recovery(msg(completed=2.0), ps, POL, "resume")
    assert plan.tool_actions == () and not plan.close_message and not plan.needed


def test_unfinished_message_alone_is_a_signal():
    plan = plan_recovery(msg(), [], POL, "resume")
    assert plan.close_message and plan.needed


def test_completed_is_kept():
    assert actions(plan_recovery(msg(), parts(("write", "completed")), POL, "resume")) == [("write", "keep", None)]


def test_error_is_kept():
    assert actions(plan_recovery(msg(), parts(("write", "error")), POL, "resume")) == [("write", "keep", None)]


@pytest.mark.parametrize("st", ["pending", "running"])
def test_unfinished_without_side_effects_is_recalled(st):
    assert actions(plan_recovery(msg(), parts(("read", st)), POL, "resume")) == [("read", "recall", None)]


@pytest.mark.parametrize("st", ["pending", "running"])
def test_unfinished_with_side_effects_is_interrupted(st):
    assert actions(plan_recovery(msg(), parts(("write", st)), POL, "resume")) == [("write", "interrupt", "resume")]


def test_everything_after_an_interrupt_is_interrupted():
    plan = plan_recovery(msg(), parts(("write", "running"), ("read", "pending"), ("read", "pending")), POL, "resume")
    assert actions(plan) == [("write", "interrupt", "resume"), ("read", "interrupt", "resume"),
                             ("read", "interrupt", "resume")]


def test_finished_calls_after_an_interrupt_are_still_kept():
    plan = plan_recovery(msg(), parts(("write", "running"), ("read", "completed")), POL, "resume")
    assert actions(plan) == [("write", "interrupt", "resume"), ("read", "keep", None)]


def test_blocking_error_interrupts_later_unfinished_calls():
    plan = plan_recovery(msg(), parts(("strict", "error"), ("read", "pending")), POL, "resume")
    assert actions(plan) == [("strict", "keep", None), ("read", "interrupt", "resume")]


def test_non_blocking_error_does_not_block():
    plan = plan_recovery(msg(), parts(("read", "error"), ("read", "pending")), POL, "resume")
    assert actions(plan) == [("read", "keep", None), ("read", "recall", None)]


def test_unregistered_tool_is_interrupted_and_blocks():
    plan = plan_recovery(msg(), parts(("gone", "running"), ("read", "pending")), POL, "resume")
    assert actions(plan) == [("gone", "interrupt", "resume"), ("read", "interrupt", "resume")]


def test_prompt_mode_interrupts_every_unfinished_call_and_recalls_none():
    ps = parts(("read", "pending"), ("write", "running"), ("read", "completed"), ("strict", "running"))
    plan = plan_recovery(msg(), ps, POL, "prompt")
    assert actions(plan) == [("read", "interrupt", "prompt"), ("write", "interrupt", "prompt"),
                             ("read", "keep", None), ("strict", "interrupt", "prompt")]
    assert plan.close_message


def test_recall_ending_in_blocking_error_turns_later_recalls_into_interrupts():
    plan = plan_recovery(msg(), parts(("strict", "pending"), ("read", "pending"), ("read", "completed")), POL, "resume")
    assert actions(plan) == [("strict", "recall", None), ("read", "recall", None), ("read", "keep", None)]
    after = block_after(plan, 0)
    assert actions(after) == [("strict", "recall", None), ("read", "interrupt", "resume"), ("read", "keep", None)]


def test_bad_mode():
    with pytest.raises(ValueError):
        plan_recovery(msg(), [], POL, "other")
