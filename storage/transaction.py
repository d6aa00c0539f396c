"""Write transactions: writes on a private branch that ``main`` moves to once, at the end, or
never (:class:`Transaction`, which :meth:`fairpipe.storage.store.FairpipeStore.transaction` opens), and
how every commit of a store is made, with its record (:func:`commit_recorded`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fairpipe.storage.arrays import open_group

if TYPE_CHECKING:  # (the store opens transactions: only its type is needed here)
    from fairpipe.storage.store import FairpipeStore

TXN_PREFIX = "fairpipe-txn-"
INTERNAL = "fairpipe_checkpoint"  # commit metadata key of a transaction's checkpoints
CHECKPOINT = "checkpoint before distributed writes"


@dataclass
class Transaction:
    """Writes on a private branch; ``main`` moves to the result once, at the end, or never.

    Icechunk cannot fork a session that holds uncommitted changes, and distributed writes need
    forks. So a transaction works on a temporary branch where it may ``checkpoint`` (commit) as
    often as it needs, and publishing is one compare-and-swap of ``main`` to the branch's tip.
    Readers of ``main`` see the old state or the new one, never a half-written one.
    """

    store: FairpipeStore
    branch: str
    session: Any
    base_snapshot: str
    # Commit metadata added inside the block (the lineage log's operation key): like the
    # transaction's own, it must hold nothing that identifies a person.
    metadata: dict = field(default_factory=dict)

    @property
    def root(self):
        return open_group(self.session, mode="a")

    def checkpoint(self, message: str) -> str:
        """Commit what is written so far to the private branch and continue in a new session."""
        snap = (
            commit_recorded(self.store.repo, self.session, message, {INTERNAL: True})
            if self.session.has_uncommitted_changes
            else None
        )
        self.session = self.store.repo.writable_session(self.branch)
        return snap or self.session.snapshot_id

    def fork(self):
        if self.session.has_uncommitted_changes:
            self.checkpoint(CHECKPOINT)
        return self.session.fork()

    def merge(self, forks) -> None:
        if forks:
            self.session.merge(*forks)

    def reading(self, job, *args):
        """``job(fork, *args)`` on a fork of the session (jobs that only read the store, on Dask),
        the fork merged back after so the transaction may commit."""
        fork = self.fork()
        result = job(fork, *args)
        self.merge([fork])
        return result


def commit_recorded(repo, session, message: str, metadata: dict | None = None) -> str:
    """``session.commit(message, metadata)`` with the record of what the commit writes
    (:func:`fairpipe.storage.manifests.commit`): how every commit of a store is made."""
    from fairpipe.storage.manifests import commit

    return commit(repo, session, message, metadata)
