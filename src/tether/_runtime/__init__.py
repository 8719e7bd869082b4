"""The agent runtime: the composition root (:mod:`.compose`), the loop that carries out
recovery plans (:mod:`.executor`: run, resume, abort, compact), the public :class:`Agent`
(:mod:`.agent`) and the progress events it reports (:mod:`.events`)."""

from tether._runtime.agent import Agent
from tether._runtime.results import RunResult, RunStatus

__all__ = ["Agent", "RunResult", "RunStatus"]
