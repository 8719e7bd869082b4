"""Named crash boundaries of the agent loop (see :mod:`tether._faults`).

Each boundary sits right after a durable step (or right before one), so a crash
injected there leaves exactly the log prefix the name describes.
"""

from __future__ import annotations

from tether._faults import register

RUN_ACCEPTED = register(
    "run_accepted", "the user entry and runStarted are durable; no model attempt yet"
)
ATTEMPT_RECORDED = register(
    "attempt_recorded", "stepAttempt is durable; the provider request has not been sent"
)
RESPONSE_RECEIVED = register(
    "response_received", "the provider answered; the answer is not in the log yet"
)
BEFORE_EFFECT = register(
    "before_effect", "toolStarted (the tool intent) is durable; the tool has not run"
)
AFTER_EFFECT = register("after_effect", "the tool ran; its result is not in the log yet")
AFTER_RESULT = register("after_result", "the tool result entry is durable")
OPERATION_FINISHED = register("operation_finished", "operationFinished is durable")

ALL = (
    RUN_ACCEPTED,
    ATTEMPT_RECORDED,
    RESPONSE_RECEIVED,
    BEFORE_EFFECT,
    AFTER_EFFECT,
    AFTER_RESULT,
    OPERATION_FINISHED,
)
