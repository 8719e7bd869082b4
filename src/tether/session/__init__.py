"""The session contract core: pure format, reducer and recovery planner.

Nothing in this package reads the clock, the disk, the environment or randomness,
except :mod:`tether.session.store`, the imperative shell that owns the log file.
"""

from tether.errors import SessionCorruption
from tether.session.canonical import (
    canonical_json,
    configuration_digest,
    sha256_digest,
    source_digest,
    tool_definition_digest,
)
from tether.session.planner import CurrentConfiguration, RecoveryPlan, plan_recovery
from tether.session.reducer import Reducer, reduce_session
from tether.session.state import SessionState

__all__ = [
    "CurrentConfiguration",
    "RecoveryPlan",
    "Reducer",
    "SessionCorruption",
    "SessionState",
    "canonical_json",
    "configuration_digest",
    "plan_recovery",
    "reduce_session",
    "sha256_digest",
    "source_digest",
    "tool_definition_digest",
]
