"""Whole snapshots, and a branch's history of them, checked against what their commits recorded
(:mod:`fairpipe.storage.manifests`).

:func:`check_snapshot` checks one snapshot in full (a transaction checks its base so before it
writes: nothing is written on top of damage): its record
(:func:`fairpipe.storage.manifests.record_problem`), every group's and array's metadata as stored, every
array's chunks as its manifest lists them.
:func:`ancestry` walks a branch's snapshots, naming one Icechunk cannot read;
:func:`history_problem` finds the first of them that names itself otherwise than its child names
it or is not what its commit recorded; :func:`verify_history` checks every snapshot of a history
(``fairpipe verify``), a snapshot written before records existed by the chunks its arrays list
against Icechunk's count of its manifests' references.
"""

from __future__ import annotations

from typing import Any

from fairpipe.storage.damage import (
    CorruptChunkError,
    DamagedMetadataError,
    damaged_store_error,
    format_chunk,
    raise_damage,
)
from fairpipe.storage.manifests import (
    _EXPECTED,
    GROUP_GONE,
    RECORD_KEY,
    _checked,
    _chunk_grid,
    _coordinates,
    _lookup,
    _metadata_problems,
    _nodes,
    _readable,
    _source,
    array_problem,
    group_problems,
    lineage_problem,
    record_problem,
)

OTHER_ID = "it names itself {found}"
UNRECORDED_REFS = "its arrays list {listed} chunks where its manifests hold {refs} chunk references"


def ancestry(repo, tip: str):
    """The ``SnapshotInfo`` of snapshot ``tip`` and of each of its ancestors, newest first
    (``Repository.ancestry``); one Icechunk cannot read is a :class:`DamagedMetadataError`
    naming it (its child names it as its parent)."""
    expected: str | None = tip
    walk = iter(repo.ancestry(snapshot_id=tip))
    while True:
        try:
            info = next(walk)
        except StopIteration:
            return
        except Exception as e:
            damage = damaged_store_error(e)
            if damage is None:
                raise
            if isinstance(damage, DamagedMetadataError) and damage.what == "A snapshot":
                damage = DamagedMetadataError(f"Snapshot {expected}", damage.why)
            raise damage from e
        _readable(info)
        expected = info.parent_id
        yield info


def history_problem(snapshots: list, tip: str) -> tuple[str, str] | None:
    """(what, why) of the first snapshot of a branch's ancestry (``SnapshotInfo``s, newest
    first, from the branch's ``tip``) that names itself otherwise than its child names it (a
    damaged snapshot) or is not what its commit recorded (:func:`record_problem`); None."""
    expected: str | None = tip
    for child, info in zip(snapshots, snapshots[1:] + [None]):
        if child.id != expected:
            return f"Snapshot {expected}", OTHER_ID.format(found=child.id)
        problem = record_problem(child)
        if problem is not None:
            return f"Snapshot {child.id}", problem
        named = lineage_problem(child, info)
        if named is not None:
            return named
        expected = child.parent_id
    return None


def snapshot_problems(session, info) -> list[tuple[str | None, str, str]]:
    """(array or None, what, why) of everything in a read-only session's snapshot (``info``:
    its ``SnapshotInfo``) that is not what its commit recorded: the record itself
    (:func:`record_problem`), every group's and array's metadata, every array's chunks as its
    manifest lists them, arrays its commit did not write or that are gone. A snapshot written
    before records existed: the chunks its arrays list, in total, against Icechunk's own count
    of its manifests' references."""
    problem = record_problem(info)
    if problem is not None:
        return [(None, f"Snapshot {info.id}", problem)]
    record = (info.metadata or {}).get(RECORD_KEY)
    if record is None:
        _, array_paths = _nodes(session)
        _, run = _source(session)
        listed = 0
        for path in array_paths:
            try:
                listed += _chunk_grid(run(lambda path=path: _coordinates(session, path))).shape[0]
            except Exception as e:
                raise_damage(e)
                raise
        refs = sum(int(m.num_chunk_refs) for m in info.manifests)
        if listed == refs:
            return []
        why = UNRECORDED_REFS.format(listed=listed, refs=refs)
        return [(None, f"Snapshot {info.id}", why)]
    # The metadata first, as stored: zarr then reads only metadata its commit wrote.
    out: list[tuple[str | None, str, str]] = []
    out += [(None, what, why) for what, why in group_problems(session, record)]
    out += [(path, what, why) for path, (what, why) in _metadata_problems(session, record)]
    if out:
        return out
    _, array_paths = _nodes(session)
    for path in array_paths:
        try:
            found = array_problem(session, path, record)
        except DamagedMetadataError as e:
            found = (e.what, e.why)
        if found is not None:
            out.append((path, *found))
    for path in sorted(set(record["arrays"]) - set(array_paths)):
        why = GROUP_GONE.format(snapshot=info.id)
        out.append((path, f"Array '{path}'", why))
    return out


def check_snapshot(store, snapshot_id: str) -> None:
    """Raise a :class:`DamagedMetadataError` for the first thing in snapshot ``snapshot_id`` of
    ``store`` (a :class:`fairpipe.storage.store.FairpipeStore`) that is not what its commit recorded
    (:func:`snapshot_problems`); nothing for a snapshot without a record."""
    session = store.readonly_session(snapshot_id)  # (checks the record: expect)
    record = _EXPECTED.get(snapshot_id)
    if record is None:
        return
    problems = snapshot_problems(session, _lookup(store.repo, snapshot_id))
    if problems:
        raise DamagedMetadataError(*problems[0][1:])
    _checked(session).update(("/", *record["arrays"]))


def verify_history(store, tip: str) -> dict:
    """Every snapshot from ``tip`` back to the repository's first, checked
    (:func:`snapshot_problems`, :func:`lineage_problem`): ``{"snapshots": checked,
    "unrecorded": of which written before records existed (their chunks counted against
    Icechunk's count only), "damaged": [{"snapshot", "array" (or None), "what", "why"}, ...]}``.
    A snapshot Icechunk cannot read ends the walk (its parent is named inside it)."""
    out: dict[str, Any] = {"snapshots": 0, "unrecorded": 0, "damaged": []}

    def found(snapshot: str | None, array: str | None, what: str, why: str) -> None:
        out["damaged"].append({"snapshot": snapshot, "array": array, "what": what, "why": why})

    infos: list = []
    unreadable: DamagedMetadataError | None = None
    try:
        for info in ancestry(store.repo, tip):
            infos.append(info)
    except DamagedMetadataError as e:
        unreadable = e
    expected: str | None = tip
    for info, parent in zip(infos, [*infos[1:], None]):
        out["snapshots"] += 1
        if info.id != expected:  # (its contents cannot be told from another's)
            found(expected, None, f"Snapshot {expected}", OTHER_ID.format(found=info.id))
            expected = info.parent_id
            continue
        expected = info.parent_id
        if RECORD_KEY not in (info.metadata or {}) and info.parent_id is not None:
            out["unrecorded"] += 1
        named = lineage_problem(info, parent) if parent or unreadable is None else None
        if named is not None:
            found(info.id, None, *named)
            if named[0] == f"Snapshot {info.id}":
                continue
        try:
            session = store.repo.readonly_session(snapshot_id=info.id)
            problems = snapshot_problems(session, info)
        except Exception as e:
            damage = damaged_store_error(e)
            if damage is not None:
                found(info.id, getattr(damage, "array", None), *_what_and_why(damage))
            elif isinstance(e, (ValueError, TypeError)) and RECORD_KEY not in info.metadata:
                # metadata zarr cannot read, with no record to tell it by first
                found(info.id, None, f"Snapshot {info.id}", f"zarr cannot read its metadata ({e})")
            else:
                raise
            continue
        for array, what, why in problems:
            found(info.id, array, what, why)
    if unreadable is not None:
        found(expected, None, unreadable.what, unreadable.why)
    return out


def _what_and_why(error: BaseException) -> tuple[str, str]:
    """(what, why) of a :class:`DamagedStoreError` as a report lists it."""
    if isinstance(error, DamagedMetadataError):
        return error.what, error.why
    if isinstance(error, CorruptChunkError):
        return f"Chunk {format_chunk(error.chunk)} of array '{error.array}'", error.why
    return type(error).__name__, str(error)
