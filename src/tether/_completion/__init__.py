"""Honest completion, the shell's part: the artifact scanner, check runs, the evidence store,
tool failures and the ``verify`` tool. The pure parts — the completion gate, the stop
conditions, the authorization policy and the values they judge (``ArtifactVersion``,
``Verification``) — are in :mod:`tether.core` (``gate``, ``stops``, ``policy``,
``values``)."""
