"""The crash lab: kill real agent runs at every crash boundary and check the recovery.

See ``docs/crashlab.md``. :mod:`.scenarios` holds the scenarios, :mod:`.child` the child
process, :mod:`.matrix` the boundary matrix and its checks, :mod:`.report` the output and
:mod:`.lab` the step-by-step ``tether lab publish-report``.
"""
