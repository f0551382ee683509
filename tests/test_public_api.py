"""The public surface: exactly the names of ``__all__``, each importable on the base install."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import inspect
import subprocess
import sys
import textwrap

import we0nb
import we0nb.testing


#: the public surface, pinned: a name added or removed here is a decision, not an accident
PUBLIC = {
    "We0Agent", "RunRequest", "RunResult", "Event", "user_message", "plan_recovery",
    "MemoryPersistence", "SqlPersistence", "Persistence",
    "tool", "AnyToolDefinition", "ToolDefinition", "ToolPolicy", "ToolContext", "Reconciled", "ToolError",
    "ToolReturn",
    "Model", "ModelRequest", "ScriptedModel", "FunctionModel", "OpenAIChatModel", "AnthropicModel", "local_model",
    "Session", "UserMessage", "AssistantMessage", "MessageError", "Usage", "Transcript", "MessageWithParts",
    "Part", "TextPart", "ReasoningPart", "ToolPart", "StepStartPart", "StepFinishPart", "CompactionPart",
    "ToolState", "ToolStatePending", "ToolStateRunning", "ToolStateCompleted", "ToolStateError",
    "We0Error", "SessionBusyError", "LeaseLostError", "MaxStepsExceeded", "ModelError", "OutputValidationError",
    "ScriptExhaustedError", "PersistenceError", "CorruptRecordError", "SchemaVersionError",
    "ModelProviderError", "ModelAuthenticationError", "ContextWindowExceeded", "CompactionError",
    "MissingExtraError", "MCPServer", "MCPServerError",
    "show", "RunPanel", "sessions_df", "messages_df", "parts_df", "tool_calls_df", "session_summary",
    "expand_json", "plot_timeline", "plot_tools",
    "BatchResult", "batches_df", "batch_df",
    "ReplayModel", "ReplayMismatchError", "compare_df", "compare", "Score", "scorer", "judge", "scores_df",
    "experiments_df", "plot_experiments",
    "load_ipython_extension",
}
#: importable from the top because SPEC names them there, but not star-imported over a
#: notebook's own variables: they belong to we0nb.testing
SPEC_ALIASES = {"text", "tool_call", "output"}


def test_all_is_pinned() -> None:
    assert set(we0nb.__all__) == PUBLIC
    assert len(we0nb.__all__) == len(set(we0nb.__all__))


def test_all_equals_the_public_members() -> None:
    # as httpx's test_exported_members: nothing public is left out of __all__, nothing stale is in it
    members = {name for name, value in vars(we0nb).items()
               if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
               and name != "TYPE_CHECKING"}
    assert (members - SPEC_ALIASES) | set(we0nb._LAZY) == set(we0nb.__all__)


def test_star_import_does_not_overwrite_a_notebooks_short_names() -> None:
    namespace: dict = {"text": "my text", "output": 1, "usage": 2, "fail": 3}
    exec("from we0nb import *", namespace)
    assert (namespace["text"], namespace["output"], namespace["usage"], namespace["fail"]) == ("my text", 1, 2, 3)


def test_every_name_resolves_and_dir_lists_the_lazy_ones() -> None:
    for name in we0nb.__all__:
        assert getattr(we0nb, name) is not None, name
    assert set(we0nb._LAZY) <= set(dir(we0nb))


def test_script_builders_live_in_testing_and_are_aliased() -> None:
    import warnings

    for name in ("text", "output", "tool_call", "ScriptedModel", "FunctionModel"):
        assert getattr(we0nb.testing, name) is getattr(we0nb, name)
    for name in ("fail", "usage", "reasoning"):  # not SPEC names: still readable, with a warning
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert getattr(we0nb, name) is getattr(we0nb.testing, name)
        assert [w.category for w in caught] == [DeprecationWarning]
        assert f"we0nb.testing.{name}" in str(caught[0].message)


def test_version_and_py_typed_come_from_the_installed_package() -> None:
    assert we0nb.__version__ == importlib.metadata.version("we0nb")
    assert importlib.resources.files("we0nb").joinpath("py.typed").is_file()


def test_star_import_works_without_the_extras() -> None:
    # a base install: the openai client and psycopg cannot be imported
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("openai", "psycopg", "anthropic"):
                    raise ImportError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, Block())
        from we0nb import *
        for make in (lambda: OpenAIChatModel("gpt-4o-mini"), lambda: AnthropicModel("claude-sonnet-4-5")):
            try:
                make()
            except ImportError as e:
                print("ERROR", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines() == [
        "ERROR OpenAIChatModel needs the 'openai' package, which is not installed: pip install \"we0nb[openai]\"",
        "ERROR AnthropicModel needs the 'anthropic' package, which is not installed: pip install \"we0nb[anthropic]\""]


def test_a_postgresql_url_without_psycopg_is_one_clear_line() -> None:
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "psycopg":
                    raise ImportError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, Block())
        from we0nb import SqlPersistence, MissingExtraError
        try:
            SqlPersistence("postgresql://postgres@127.0.0.1:5432/test")
        except MissingExtraError as e:
            print("ERROR", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("ERROR SqlPersistence with a PostgreSQL URL needs the 'psycopg' package, which is "
                                  'not installed: pip install "we0nb[postgres]"')
