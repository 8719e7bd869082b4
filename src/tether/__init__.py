"""tether: run AI agents so that a crash never makes a side effect happen twice."""

__version__ = "0.1.0"
