"""The scripted model, under its public name (``tether.testing.scripted.ScriptedModel``).

It lives in :mod:`tether._models.scripted`, beside the other adapters, so that the model
loader (:mod:`tether._models`) does not import the testing package; this module re-exports
it and keeps the public import path.
"""

from __future__ import annotations

from tether._models.scripted import ADAPTER_IDENTITY, FINISH_REASONS, MAX_DELAY, ScriptedModel

__all__ = ["ADAPTER_IDENTITY", "FINISH_REASONS", "MAX_DELAY", "ScriptedModel"]
