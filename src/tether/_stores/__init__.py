"""Session stores: where session logs live, behind one seam (:mod:`.protocol`).

* :mod:`.protocol` — ``SessionStoreProtocol`` (one open log) and ``SessionOpener``;
* :mod:`.file` — the default: one append-only JSONL file per session (``docs/store.md``);
* :mod:`.memory` — the same rules in memory (tests, and the reference for a new backend);
* :mod:`.transaction` — encoding and validating a transaction, shared by every store;
* :mod:`.locking`, :mod:`.sidecar` — the file store's single-writer lock and side records.
"""
