"""Compaction policy (pure): which messages to summarise and which to keep verbatim."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

COMPACTION_SYSTEM_PROMPT = (
    "You summarise an agent's conversation so that the work can continue from the summary. "
    "Keep every fact a continuation needs: the goal, decisions, file names, commands run "
    "and their outcomes, and what remains to do. Be concise."
)
COMPACTION_INSTRUCTION = (
    "Summarise the conversation above for a continuation of this work. "
    "Answer with the summary only."
)


def plan_split(
    messages: Sequence[Mapping[str, Any]], entry_ids: Sequence[str], keep_turns: int
) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """Split message entry ids into (compacted, retained), keeping the latest turns.

    A turn starts at a user message. The retained part is the last ``keep_turns``
    complete turns, so it is a legal transcript on its own (it never separates a tool
    result from its assistant message). ``None`` when nothing would be compacted.
    """
    starts = [i for i, message in enumerate(messages) if message.get("role") == "user"]
    if len(starts) <= keep_turns:
        return None
    cut = starts[-keep_turns]
    if cut == 0:
        return None
    ids = tuple(entry_ids[: len(messages)])
    return ids[:cut], ids[cut:]
