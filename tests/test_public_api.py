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


def test_all_equals_the_public_members() -> None:
    # as httpx's test_exported_members: nothing public is left out of __all__, nothing stale is in it
    members = {name for name, value in vars(we0nb).items()
               if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
               and name != "TYPE_CHECKING"}
    assert members | set(we0nb._LAZY) == set(we0nb.__all__)
    assert len(we0nb.__all__) == len(set(we0nb.__all__))


def test_every_name_resolves_and_dir_lists_the_lazy_ones() -> None:
    for name in we0nb.__all__:
        assert getattr(we0nb, name) is not None, name
    assert set(we0nb._LAZY) <= set(dir(we0nb))


def test_script_builders_live_in_testing_and_are_aliased() -> None:
    for name in ("text", "output", "fail", "usage", "reasoning", "tool_call", "ScriptedModel", "FunctionModel"):
        assert getattr(we0nb.testing, name) is getattr(we0nb, name)


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
