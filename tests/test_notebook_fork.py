"""RunPanel's Fork here row without a kernel: the message picker, a click from another thread,
the fork read back from the store, a refused fork said in the row, the button while a run goes on."""

import pytest

from we0nb import ScriptedModel, We0Agent, text
from we0nb.notebook import RunPanel
from widgetkit import click_from_thread, until

pytest.importorskip("ipywidgets")


class Handle:
    def update(self, bundle):
        pass


async def test_fork_here_at_the_chosen_message_from_another_thread_then_go_on_there():
    agent = We0Agent(ScriptedModel([[text("first answer")], [text("second answer")], [text("a what-if answer")]]))
    panel = RunPanel(agent, session_id="ses_fp", display=lambda b: Handle())
    box = panel.forks
    assert box.widget.layout.display == "none" and box.fork_button.disabled  # (no messages yet)
    for prompt in ("one", "two"):
        panel.start(prompt)
        await panel.wait()
    ids = [m.info.id for m in (await agent.transcript("ses_fp")).messages]
    assert [label for label, _ in box.picker.options] == [
        "#1 user: one", "#2 assistant: first answer", "#3 user: two", "#4 assistant: second answer"]
    assert [value for _, value in box.picker.options] == ids
    assert box.picker.value == ids[-1] and not box.fork_button.disabled and box.widget.layout.display == "flex"

    box.picker.value = ids[1]  # the first answer
    click_from_thread(box.fork_button)
    await until(lambda: box.forks)
    fid = box.forks[0]
    assert box.click_threads == ["subshell-fake"] and not box.fork_button.disabled
    assert fid in box.message.value and "message #2" in box.message.value and "nothing ran" in box.message.value
    fork = await agent.transcript(fid)
    assert [m.text for m in fork.messages] == ["one", "first answer"]
    assert fork.session.forked_from == "ses_fp" and fork.session.forked_at == ids[1]
    assert len((await agent.transcript("ses_fp")).messages) == 4  # the source is not changed

    other = RunPanel(agent, session_id=fid, display=lambda b: Handle())  # the what-if, in a panel of its own
    other.start("what if?")
    assert (await other.wait()).text == "a what-if answer"
    assert [label for label, _ in other.forks.picker.options][-2:] == ["#3 user: what if?",
                                                                     "#4 assistant: a what-if answer"]


async def test_a_refused_fork_is_said_in_the_row_and_the_button_waits_for_the_run():
    agent = We0Agent(ScriptedModel([[text("answer")], [text([f"w{i} " for i in range(400)])]], delay=0.002))
    panel = RunPanel(agent, session_id="ses_fr", display=lambda b: Handle())
    panel.start("q")
    await panel.wait()
    ids = [m.info.id for m in (await agent.transcript("ses_fr")).messages]
    await agent.revert("ses_fr", ids[1])  # the answer is hidden now, though the row still lists it
    box = panel.forks
    box.picker.value = ids[1]
    click_from_thread(box.fork_button)
    await until(lambda: "Not forked" in box.message.value)
    assert "hidden by a revert" in box.message.value and box.forks == []
    with pytest.raises(ValueError, match="is not in session"):
        await panel.fork("msg_nope")

    panel.start("long")  # (a prompt: the hidden answer is deleted)
    assert box.fork_button.disabled and box.picker.disabled  # while the run goes on
    await panel.wait()
    assert not box.fork_button.disabled
    assert [label.split(":")[0] for label, _ in box.picker.options] == ["#1 user", "#2 user", "#3 assistant"]
    fid = await panel.fork()  # the last message, as the row chose it
    assert (await agent.transcript(fid)).session.forked_at == box.picker.options[-1][1]
