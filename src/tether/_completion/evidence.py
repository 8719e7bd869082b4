"""Verification evidence: the results of the check command (table ``verifications``).

A verification records one run of the project's check command (``[verify] command``): the
command, how it ended, a digest of its full output and the last few KB of it, and the
artifact version of the workspace before and after the run. Its status follows from those
facts alone (:func:`~tether.core.values.verification_status`, pure, in the core with the
:class:`Verification` value; both re-exported here):

* ``error`` — the command could not be run, was cancelled, or a version could not be
  computed: nothing is known;
* ``void`` — the files changed while the command ran: the result proves nothing about any
  version, even if the command exited 0;
* ``failed`` — the command timed out or exited non-zero;
* ``passed`` — it exited 0 and the workspace was the same version before and after.

Only ``passed`` is ever treated as verified. Alongside a verification the manifest of its
artifact version may be kept (table ``artifact_manifests``: opaque bytes, written once).

The SQLite table is :class:`~tether._wsdb.sqlite_verification.VerificationStore` (beside the
database, which makes it), re-exported here with :func:`~tether._wsdb.rules.new_verification`.
"""

from __future__ import annotations

from tether._wsdb.rules import new_verification
from tether._wsdb.sqlite_verification import VerificationStore
from tether.core.values import Verification, VerificationStatus, verification_status

__all__ = [
    "Verification",
    "VerificationStatus",
    "VerificationStore",
    "new_verification",
    "verification_status",
]
