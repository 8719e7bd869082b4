"""The session contract core: pure format, reducer and recovery planner.

Nothing in this package reads the clock, the disk, the environment or randomness,
except :mod:`tether._stores.file`, the imperative shell that owns the log file.
"""

from tether.core.canonical import (
    canonical_json,
    configuration_digest,
    sha256_digest,
    source_digest,
    tool_definition_digest,
)
from tether.core.planner import CurrentConfiguration, RecoveryPlan, plan_recovery
from tether.core.reducer import Reducer, reduce_session
from tether.core.state import SessionState
from tether.errors import SessionCorruption

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
