"""Model adapters: the one place tether talks to a language model.

* :class:`~tether._models.openai_compat.OpenAICompatibleModel` — chat completions via the
  official ``openai`` SDK (OpenRouter by default; OpenAI, vLLM, Ollama, llama.cpp, …).
* :class:`~tether._models.anthropic_native.AnthropicModel` — Anthropic's Messages API via the
  official ``anthropic`` SDK (``--model anthropic:MODEL``; extra ``tether[anthropic]``).
* :class:`~tether._models.scripted.ScriptedModel` — answers from a JSON file, by position
  (public as ``tether.testing.scripted.ScriptedModel``).
* :mod:`.http_common` — what the two HTTP adapters share (base URLs, error texts,
  ``Retry-After``).
* :mod:`.encoded` — request bodies in O(new bytes): each context message encoded once
  (:mod:`.anthropic_wire` joins them into the Messages API's turns).

:func:`load_model` turns a ``--model`` value into an adapter.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tether._models.base import (
    MODEL_ERROR_CODES,
    ModelAdapter,
    TokenUsage,
    stop_reason_for,
    validate_output_options,
)
from tether.errors import ConfigurationError, ModelError

if TYPE_CHECKING:
    from tether._models.messages import ModelRequest, ModelResponse, ToolCallOut
    from tether._models.openai_compat import OpenAICompatibleModel
    from tether._models.scripted import ScriptedModel

ENV_MODEL = "TETHER_MODEL"


def __getattr__(name: str) -> Any:
    if name in ("ModelRequest", "ModelResponse", "ToolCallOut"):
        # A call's values (tether._models.messages): not loaded by building an adapter.
        from tether._models import messages

        return getattr(messages, name)
    # The openai SDK takes ~0.5 s to import; only real model runs need it.
    if name == "OpenAICompatibleModel":
        from tether._models.openai_compat import OpenAICompatibleModel

        return OpenAICompatibleModel
    if name == "ScriptedModel":
        # Imported here: only a scripted: model (tests, demos) needs it.
        from tether._models.scripted import ScriptedModel

        return ScriptedModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ANTHROPIC_PREFIX",
    "MODEL_ERROR_CODES",
    "SCRIPTED_PREFIX",
    "ModelAdapter",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "OpenAICompatibleModel",
    "ScriptedModel",
    "TokenUsage",
    "ToolCallOut",
    "load_model",
    "stop_reason_for",
    "validate_output_options",
]

SCRIPTED_PREFIX = "scripted:"
ANTHROPIC_PREFIX = "anthropic:"


_CLOSE = 0.75
"""How alike a word and a prefix must be to be taken for a misspelling (difflib's ratio)."""


def _may_be_close(word: str, prefix: str, cutoff: float) -> bool:
    """Whether difflib could find ``word`` and ``prefix`` ``cutoff``-alike: its
    ``quick_ratio`` (twice the letters they share over their total length) is an upper
    bound of the ratio ``get_close_matches`` compares, so below the cutoff they are not."""
    shared = sum(min(word.count(c), prefix.count(c)) for c in set(word))
    return 2.0 * shared / (len(word) + len(prefix)) >= cutoff


def _refuse_misspelt_prefix(spec: str) -> None:
    """A ``scriptd:…`` or ``antropic:…`` is a typo, not a model id to send to the default
    endpoint with the user's key. Model ids may hold a colon (``llama3:8b``, OpenRouter's
    ``…:free``), so only a word before the colon that is close to a prefix is refused."""
    word, colon, _ = spec.partition(":")
    if not colon or "/" in word:
        return
    known = [SCRIPTED_PREFIX[:-1], ANTHROPIC_PREFIX[:-1]]
    lowered = word.lower()
    if not any(_may_be_close(lowered, prefix, _CLOSE) for prefix in known):
        return  # no prefix is close (openai:…, llama3:8b): difflib is not imported
    import difflib  # only for a word that may be a misspelt prefix

    close = difflib.get_close_matches(lowered, known, n=1, cutoff=_CLOSE)
    if close and word not in known:
        raise ConfigurationError(
            f"unknown model prefix {word + ':'!r} in {spec!r}: did you mean {close[0] + ':'!r}?"
        )


def load_model(
    spec: str | None = None,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    timeout: float | None = None,
    provider: str | None = None,
    environ: Mapping[str, str] | None = None,
    idle_timeout: float | None = None,
    stream: bool | None = None,
    extra_headers: Mapping[str, str] | None = None,
) -> ModelAdapter:
    """The adapter for a ``--model`` value.

    ``scripted:PATH`` loads a :class:`ScriptedModel` from ``PATH`` (the connection
    flags are ignored). ``anthropic:MODEL`` is Anthropic's Messages API (key from
    ``--api-key`` or ``ANTHROPIC_API_KEY``, never ``TETHER_API_KEY``; base URL from
    ``--base-url``/``TETHER_BASE_URL``, else ``ANTHROPIC_BASE_URL``). Anything else is a model
    id for the OpenAI-compatible adapter, configured from the flags and the ``TETHER_*``
    environment variables. An empty or missing ``spec`` falls back to ``TETHER_MODEL``.
    """
    env = os.environ if environ is None else environ
    chosen = (spec or "").strip() or env.get(ENV_MODEL, "").strip()
    if chosen.startswith(SCRIPTED_PREFIX):
        path = chosen[len(SCRIPTED_PREFIX) :]
        if not path:
            raise ConfigurationError("--model scripted: needs a path, e.g. scripted:demo.json")
        from tether._models.scripted import ScriptedModel  # see __getattr__

        return ScriptedModel.from_file(path)
    if chosen.startswith(ANTHROPIC_PREFIX):
        from tether._models.anthropic_native import AnthropicModel

        name = chosen[len(ANTHROPIC_PREFIX) :].strip()
        anthropic_options: dict[str, Any] = {}
        if timeout is not None:
            anthropic_options["timeout"] = timeout
        if idle_timeout is not None:
            anthropic_options["idle_timeout"] = idle_timeout
        if extra_headers:
            anthropic_options["extra_headers"] = extra_headers
        return AnthropicModel.from_env(
            name,
            # TETHER_BASE_URL as for the CLI, where the --base-url setting reads it; else
            # from_env reads ANTHROPIC_BASE_URL. A /v1 ending is refused, so an
            # OpenAI-style TETHER_BASE_URL never receives the Anthropic key.
            base_url=base_url or env.get("TETHER_BASE_URL", "").strip() or None,
            api_key=api_key,
            provider=provider,
            environ=env,
            **anthropic_options,
        )
    _refuse_misspelt_prefix(chosen)
    if not chosen:
        raise ConfigurationError(
            f"no model given: pass --model or set {ENV_MODEL} "
            "(a model id such as 'openai/gpt-4o-mini', or scripted:PATH)"
        )
    from tether._models.openai_compat import OpenAICompatibleModel

    return OpenAICompatibleModel.from_env(
        chosen,
        base_url=base_url,
        api_key=api_key,
        timeout=timeout,
        provider=provider,
        environ=env,
        **{
            k: v
            for k, v in (
                ("idle_timeout", idle_timeout),
                ("stream", stream),
                ("extra_headers", extra_headers),
            )
            if v is not None
        },
    )
