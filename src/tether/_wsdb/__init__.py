"""The workspace database (journal, reviews, authorizations, verifications, failures),
behind one seam (:mod:`.protocol`).

* :mod:`.protocol` — ``WorkspaceDB`` and one protocol per table group;
* :mod:`.sqlite` — the default, ``<workspace>/.tether/effects.db`` (``docs/effects.md``);
* :mod:`.memory` — the same tables and rules in memory (tests, and the reference for a new
  backend).
"""
