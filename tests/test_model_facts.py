"""What every model tells a trace and a price lookup (provider, request model, server, a
price its user gave), how ``we0nb.models`` loads its optional names, and how model errors
are built. The HTTP adapters' streaming, retries and errors are in test_conformance.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from we0nb import FunctionModel, ScriptedModel, text
from we0nb.errors import (
    ContextWindowExceeded,
    ModelAuthenticationError,
    ModelError,
    ModelProviderError,
    ScriptExhaustedError,
)
from we0nb.models import ModelPrice

BAD_PRICES = [(-0.1, 1.0), ("0.15", 0.6), (0.15, float("nan")), (True, 1), (1.0, float("inf")), 3,
              (1, 2, 3), {"input": 1, "output": 2}, "free"]


def test_offline_models_have_no_server_and_no_known_price():
    m = ScriptedModel([[text("hi")]])
    assert (m.provider_name, m.request_model, m.server_address, m.server_port, m.price) == (
        "we0nb", "scripted", None, None, None)
    f = FunctionModel(lambda r: "hi", model_id="gpt-4o-mini", provider="openai", price=(0.15, 0.6))
    assert (f.provider_name, f.request_model) == ("openai", "gpt-4o-mini")
    assert f.price == ModelPrice(0.15, 0.6) and f.price.input_mtok == 0.15 and f.price.output_mtok == 0.6
    assert ScriptedModel([], price=ModelPrice(0, 0)).price == ModelPrice(0, 0)


def test_openai_model_facts(monkeypatch):
    openai = pytest.importorskip("openai")
    from we0nb import OpenAIChatModel

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    m = OpenAIChatModel("gpt-4o-mini", api_key="k", model_id="mini")
    assert (m.provider_name, m.request_model, m.model_id) == ("openai", "gpt-4o-mini", "mini")
    assert (m.server_address, m.server_port, m.price) == ("api.openai.com", 443, None)
    # a self-hosted server is still priced as provider "openai" by model id (SPEC §13) ...
    vllm = OpenAIChatModel("Qwen/Qwen3-8B", base_url="http://10.0.0.7:8000/v1")
    assert (vllm.provider_name, vllm.server_address, vllm.server_port) == ("openai", "10.0.0.7", 8000)
    assert OpenAIChatModel("m", base_url="http://localhost/v1").server_port == 80
    # ... unless it is given its own provider or price
    ds = OpenAIChatModel("deepseek-chat", base_url="https://api.deepseek.com", provider="deepseek",
                         price=(0.27, 1.1))
    assert (ds.provider_name, ds.server_address, ds.server_port) == ("deepseek", "api.deepseek.com", 443)
    assert ds.price == ModelPrice(0.27, 1.1)
    # the URL the client will use: from the environment, or from a client given as is
    monkeypatch.setenv("OPENAI_BASE_URL", "https://proxy.example:8443/v1")
    assert (OpenAIChatModel("m", api_key="k").server_address, OpenAIChatModel("m", api_key="k").server_port) == (
        "proxy.example", 8443)
    given = OpenAIChatModel("m", client=openai.AsyncOpenAI(api_key="k", base_url="http://192.168.1.5:9000/v1"))
    assert (given.server_address, given.server_port) == ("192.168.1.5", 9000)


def test_anthropic_model_facts(monkeypatch):
    pytest.importorskip("anthropic")
    from we0nb import AnthropicModel

    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    m = AnthropicModel("claude-sonnet-4-5", api_key="k")
    assert (m.provider_name, m.request_model, m.server_address, m.server_port, m.price) == (
        "anthropic", "claude-sonnet-4-5", "api.anthropic.com", 443, None)
    proxy = AnthropicModel("claude-haiku-4-5", base_url="http://127.0.0.1:4000", price=ModelPrice(1, 5))
    assert (proxy.server_address, proxy.server_port, proxy.price) == ("127.0.0.1", 4000, ModelPrice(1, 5))


def _constructors() -> list:
    makers = [lambda **kw: ScriptedModel([], **kw), lambda **kw: FunctionModel(lambda r: "x", **kw)]
    try:
        import openai  # noqa: F401

        from we0nb import OpenAIChatModel
        makers.append(lambda **kw: OpenAIChatModel("m", api_key="k", **kw))
    except ImportError:
        pass
    try:
        import anthropic  # noqa: F401

        from we0nb import AnthropicModel
        makers.append(lambda **kw: AnthropicModel("m", api_key="k", **kw))
    except ImportError:
        pass
    return makers


@pytest.mark.parametrize("bad", BAD_PRICES, ids=repr)
def test_a_price_that_is_not_two_numbers_at_least_zero_is_refused(bad):
    for make in _constructors():
        with pytest.raises(ValueError, match=r"price=\.\.\.: expected USD per million input and output tokens"):
            make(price=bad)


def test_a_provider_must_be_a_name():
    for make in _constructors():
        for bad in ("", "  ", 3):
            with pytest.raises(ValueError, match=r"provider=\.\.\.\): expected a provider name"):
                make(provider=bad)


def test_optional_names_load_on_first_use_only():
    code = textwrap.dedent("""
        import sys
        import we0nb.models as models
        heavy = ("we0nb.models.openai", "we0nb.models.anthropic", "we0nb.models.local", "openai", "anthropic")
        print(sorted(m for m in heavy if m in sys.modules))
        from we0nb.models.openai import OpenAIChatModel
        from we0nb.models.local import LocalModel, local_model
        print(models.OpenAIChatModel is OpenAIChatModel, models.LocalModel is LocalModel,
              models.local_model is local_model, "OpenAIChatModel" in models.__all__)
        try:
            models.NoSuchModel
        except AttributeError as e:
            print(e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "True True True True",
                                       "module 'we0nb.models' has no attribute 'NoSuchModel'"]


def test_public_modules_of_the_models_package():
    """Implementation modules are private (``_``); the public ones are those the docs name."""
    import pkgutil

    import we0nb.models as models

    public = {m.name for m in pkgutil.iter_modules(models.__path__) if not m.name.startswith("_")}
    assert public == {"base", "scripted", "openai", "anthropic", "local", "view", "pricing"}


def test_every_model_error_is_initialised_by_model_error(monkeypatch):
    seen: list[type] = []
    init = ModelError.__init__

    def spy(self, *args, **kwargs):
        seen.append(type(self))
        init(self, *args, **kwargs)

    monkeypatch.setattr(ModelError, "__init__", spy)
    errors = [ModelError("s", "m", ValueError("boom")), ScriptExhaustedError("no step left"),
              ModelProviderError("HTTP 500", status_code=500, retryable=True),
              ModelAuthenticationError("HTTP 401", status_code=401), ContextWindowExceeded("too long")]
    assert seen == [type(e) for e in errors]
    for e in errors:
        assert (e.session_id, e.message_id) == (("s", "m") if type(e) is ModelError else (None, None))
    assert str(errors[0]).startswith("The model failed in session 's' (assistant message 'm'): ValueError: boom.")
    assert errors[0].cause is not None and errors[2].cause is None
    assert str(errors[2]) == "HTTP 500" and errors[2].args == ("HTTP 500",)
    assert (errors[2].status_code, errors[2].retryable) == (500, True)
