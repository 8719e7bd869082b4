"""The operating system's confinement of the commands the agent runs (docs/sandbox.md).

:mod:`tether._sandbox.policy` decides what a command may do (modes, paths, the bubblewrap
command line); :mod:`tether._sandbox.bwrap` finds and checks the mechanism and wraps each
command; :mod:`tether._sandbox.selftest` is ``tether sandbox check``'s proof.
"""
