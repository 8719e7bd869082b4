"""The agent runtime: the executor that carries out recovery plans (run, resume, abort,
compact) and the progress events it reports."""

from tether._runtime.executor import Agent, RunResult, RunStatus

__all__ = ["Agent", "RunResult", "RunStatus"]
