"""What each commit wrote, recorded with it, and the checks of a snapshot against that record.

A chunk's checksum catches damage to its bytes, not damage to the manifest that lists the chunks
or to the snapshot that lists the arrays: a manifest whose bytes change may still decode, to a
list without a chunk, which then reads as the fill value (a different answer, no error). So
every commit a store makes (:func:`commit`) records in its commit metadata, under
``fairpipe_manifests``:

- per array, how many chunks its manifest lists, a digest of their coordinates and a digest of
  its metadata as stored (its ``zarr.json``: shape, chunks, codecs, attributes);
- per group, a digest of its metadata;
- the total of chunks, digests of the commit's message and other metadata, the parent snapshot
  (its id and time: the one thing of a snapshot its own record cannot hold), and a digest of the
  record itself.

Counts and digests only: nothing in it identifies a person (commit metadata cannot be erased),
about 2.6 kB for a store of 33 arrays. Only the arrays and groups a commit changed are listed
again (``Session.status``); the others' entries come from the parent's record, so the cost
follows the work and a write never seals damage it did not make. A transaction first checks its
base snapshot in full (:func:`fairpipe.storage.snapshot_checks.check_snapshot`): nothing is written on top
of damage.

Readers check what they read: :func:`expect` (for every read-only session a store opens) checks
the snapshot's record, and that its manifests, as the snapshot lists them, hold as many chunk
references as the record says (Icechunk's own count per manifest, ``SnapshotInfo.manifests``:
no manifest is read); :func:`check_array` (the first time a session opens an array for reading)
lists the array's chunks (``Session.chunk_coordinates``: from its manifest, which the read
fetches anyway) and compares them and its metadata with the record; :func:`check_groups` (the
first time a session opens the root group) compares every node's metadata, as stored, before
zarr reads any of it. A snapshot written before records existed is read as before
(``verify`` still compares the chunks its arrays list with Icechunk's count of its manifests'
references). :func:`fairpipe.storage.snapshot_checks.verify_history` checks every snapshot of a history.

Everything here uses Icechunk's public API. Three behaviours of Icechunk 1.1 are relied on, and
tests/storage/test_manifests.py fails with a clear message if a release changes them: a
snapshot's manifests hold exactly the chunk references its arrays list (one manifest per array,
written again when the array changes or shrinks); a node's metadata reads back as the bytes
written; the repository's first snapshot has a fixed id, message and metadata.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from typing import Any

import numpy as np

from fairpipe.storage.chunks import _chunk_source, _metadata_read, zarr_api
from fairpipe.storage.damage import DamagedMetadataError, damaged_store_error, raise_damage

RECORD_KEY = "fairpipe_manifests"
CREATED = "create fairpipe store"  # the message of a store's first commit
RECORD_VERSION = 1
# The coordinates listed per round trip into Icechunk's compiled code.
COORDINATE_BATCH = 4096

NOT_RECORDED = "it is not among the arrays its commit {snapshot} wrote"
COUNT_DIFFERS = "it lists {found} chunks where commit {snapshot} wrote {written}"
COORDS_DIFFER = "it lists other chunks than commit {snapshot} wrote"
META_DIFFERS = "it is not what commit {snapshot} wrote"
GROUP_GONE = "it is missing from snapshot {snapshot}, whose commit wrote it"
RECORD_DAMAGED = "its record of what its commit wrote fails its own digest"
MESSAGE_DIFFERS = "its commit message is not the one its commit recorded"
METADATA_DIFFERS = "its commit metadata is not what its commit recorded"
RECORD_MISSING = "it has no record of what its commit wrote, where its parent {parent} has one"
# The repository's first snapshot, which Icechunk writes (it holds nothing): its fixed id,
# message and metadata, against which it is checked (it has no record).
FIRST_SNAPSHOT = ("1CECHNKREP0F1RSTCMT0", "Repository initialized", {"__root": True})
FIRST_DIFFERS = "it is not the repository's first snapshot as Icechunk writes it"
OTHER_PARENT = "its parent {parent} is not the snapshot its commit recorded"
OTHER_TIME = "its time is not the one its child {child} recorded"
REFS_DIFFER = "its manifests hold {found} chunk references where its commit wrote {written}"

# Per process: each snapshot's record (None: a snapshot written before records existed); a
# snapshot never changes. Per session (by its id, dropped with it): what was checked through it
# (a copy of a store has the same snapshots, not the same manifests).
_EXPECTED: dict[str, dict | None] = {}
_CHECKED: dict[int, set[str]] = {}


def _checked(session) -> set[str]:
    key = id(session)
    if key not in _CHECKED:
        _CHECKED[key] = set()
        weakref.finalize(session, _CHECKED.pop, key, None)
    return _CHECKED[key]


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _sealed(body: dict) -> str:
    return _digest(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def _node_path(path: str) -> str:
    """A path as Icechunk's status names it (``/summary/ids``) as the record keys it."""
    return path.strip("/")


def _meta_key(path: str) -> str:
    return f"{path}/zarr.json" if path else "zarr.json"


def _source(session):
    return _chunk_source(session)


async def _coordinates(session, path: str) -> list:
    """The chunk coordinates array ``path`` of a session lists, as arrays of rows (in batches
    where the session gives them so: :meth:`fairpipe.storage.light.LightSession.coordinate_batches`)."""
    batches = getattr(session, "coordinate_batches", None)
    if batches is not None:
        listed = batches(f"/{path}", COORDINATE_BATCH)
        return [np.asarray(b, dtype=np.int64) async for b in listed if len(b)]
    return [c async for c in session.chunk_coordinates(f"/{path}", COORDINATE_BATCH)]


def _chunk_grid(coords: list) -> np.ndarray:
    """Chunk coordinates (tuples, or arrays of rows) as rows of an int64 array, sorted, each
    once: Icechunk 1.1 lists a chunk written in a session that has not committed twice (once
    as its parent snapshot held it, once as written), and lists in no fixed order."""
    if not coords:
        return np.zeros((0, 0), dtype=np.int64)
    if isinstance(coords[0], np.ndarray):
        grid = np.concatenate([c.reshape(c.shape[0], -1) for c in coords])
    else:
        grid = np.asarray(coords, dtype=np.int64).reshape(len(coords), -1)
    if grid.shape[1] == 0:  # a 0-d array: its one chunk
        return grid[:1]
    grid = grid[np.lexsort(grid.T[::-1])]
    new = np.ones(grid.shape[0], dtype=bool)
    new[1:] = (grid[1:] != grid[:-1]).any(axis=1)
    return grid[new]


async def _array_entry(session, get, path: str) -> list:
    """[chunks listed, digest of their coordinates, digest of the array's metadata]."""
    grid = _chunk_grid(await _coordinates(session, path))
    meta = await get(_meta_key(path))
    return [int(grid.shape[0]), _digest(np.ascontiguousarray(grid).tobytes()),
            _digest(b"" if meta is None else bytes(meta))]  # fmt: skip


async def _group_entry(get, path: str) -> str | None:
    meta = await get(_meta_key(path))
    return None if meta is None else _digest(bytes(meta))


def _nodes(session) -> tuple[list[str], list[str]]:
    """(group paths, array paths) of every node of a session's store, the root group ``""``."""
    try:
        with _metadata_read("the root group"):  # (unchecked: what is checked is listed here)
            root = zarr_api().open_group(session.store, mode="r")
    except FileNotFoundError:  # the repository's empty first snapshot
        return [], []
    groups, arrays = [""], list[str]()
    with _metadata_read("a node"):
        for name, node in root.members(max_depth=None):
            (groups if hasattr(node, "members") else arrays).append(name)
    return sorted(groups), sorted(arrays)


def _seal(arrays: dict, groups: dict, message: str, metadata: dict, parent: list) -> dict:
    body = {"v": RECORD_VERSION, "arrays": arrays, "groups": groups,
            "chunks": int(sum(entry[0] for entry in arrays.values())),
            "message": _digest(message.encode()), "metadata": _sealed(metadata),
            "parent": parent}  # fmt: skip
    return {**body, "check": _sealed(body)}


# -- writing ---------------------------------------------------------------------------------------
def record_for(repo, session, message: str, metadata: dict | None = None) -> dict:
    """The record of the commit ``session`` is about to make with ``message`` and commit
    ``metadata``: the parent's entries, with those of the arrays and groups the session changed
    listed again."""
    import asyncio

    parent_info = _lookup(repo, session.snapshot_id)
    parent = parent_record(repo, session.snapshot_id)
    get, run = _source(session)
    if parent is None:
        group_paths, array_paths = _nodes(session)
        arrays: dict[str, Any] = {}
        groups: dict[str, Any] = {}
    else:
        status = session.status()
        gone = {_node_path(p) for p in (*status.deleted_groups, *status.deleted_arrays)}
        arrays = {p: e for p, e in parent["arrays"].items() if not _under(p, gone)}
        groups = {p: e for p, e in parent["groups"].items() if not _under(p, gone)}
        # (a node deleted and made again is in both; one changed, then deleted, is gone)
        new = {_node_path(p) for p in (*status.new_arrays, *status.new_groups)}
        changed = {_node_path(p) for p in (*status.updated_arrays, *status.updated_chunks)}
        array_paths = sorted({_node_path(p) for p in status.new_arrays}
                             | {p for p in changed if not _under(p, gone - new)})  # fmt: skip
        group_paths = sorted({_node_path(p) for p in (*status.new_groups, *status.updated_groups)
                              if not _under(_node_path(p), gone - new)})  # fmt: skip

    async def listed() -> tuple[list, list]:
        return await asyncio.gather(
            asyncio.gather(*(_array_entry(session, get, p) for p in array_paths)),
            asyncio.gather(*(_group_entry(get, p) for p in group_paths)),
        )

    array_entries, group_entries = run(listed)
    arrays.update(zip(array_paths, array_entries))
    groups.update((p, e) for p, e in zip(group_paths, group_entries) if e is not None)
    # The parent as this commit sees it: its time, which its own record cannot hold.
    parent_seen = [parent_info.id, parent_info.written_at.isoformat()]
    return _seal(dict(sorted(arrays.items())), dict(sorted(groups.items())), message,
                 metadata or {}, parent_seen)  # fmt: skip


def _under(path: str, gone: set[str]) -> bool:
    """Whether node ``path`` is one of ``gone`` or inside one of them."""
    return path in gone or any(path.startswith(f"{g}/") or g == "" for g in gone)


def commit(repo, session, message: str, metadata: dict | None = None) -> str:
    """``session.commit(message, metadata)`` with the record of what it writes added to the
    metadata (:func:`record_for`); returns the new snapshot's id."""
    metadata = {k: v for k, v in (metadata or {}).items() if k != RECORD_KEY}
    record = record_for(repo, session, message, metadata)
    snapshot = session.commit(message, metadata={**metadata, RECORD_KEY: record})
    _EXPECTED[snapshot] = record
    return snapshot


def parent_record(repo, snapshot_id: str) -> dict | None:
    """The record of snapshot ``snapshot_id`` (checked), None where it has none."""
    if snapshot_id in _EXPECTED:
        return _EXPECTED[snapshot_id]
    return snapshot_record(_lookup(repo, snapshot_id))


def _lookup(repo, snapshot_id: str):
    try:
        info = repo.lookup_snapshot(snapshot_id)
    except Exception as e:
        raise_damage(e)
        raise
    return _readable(info)


# -- checking --------------------------------------------------------------------------------------
def record_problem(info) -> str | None:
    """What is wrong with the record of snapshot ``info`` (a ``SnapshotInfo``) on its own, or
    with the chunk references its manifests hold as the snapshot lists them; None where
    nothing is (or it has no record)."""
    record = (info.metadata or {}).get(RECORD_KEY)
    if record is None:
        return None
    try:
        body = {k: v for k, v in record.items() if k != "check"}
        sealed = record.get("check") == _sealed(body)
    except (AttributeError, TypeError, ValueError):
        sealed = False
    if not sealed:
        return RECORD_DAMAGED
    if record["message"] != _digest(info.message.encode()):
        return MESSAGE_DIFFERS
    others = {k: v for k, v in (info.metadata or {}).items() if k != RECORD_KEY}
    if record["metadata"] != _sealed(others):
        return METADATA_DIFFERS
    found = sum(int(m.num_chunk_refs) for m in info.manifests)
    if found != record["chunks"]:
        return REFS_DIFFER.format(found=found, written=record["chunks"])
    return None


def _readable(info):
    """``info`` (a ``SnapshotInfo``), once its fields convert to Python values: a time Python
    cannot hold (a damaged snapshot: year 231251) is a :class:`DamagedMetadataError`."""
    try:
        info.written_at  # noqa: B018 (converted when read)
        info.metadata  # noqa: B018
    except (ValueError, OverflowError) as e:
        why = f"its time or metadata cannot be read ({e})"
        raise DamagedMetadataError(f"Snapshot {info.id}", why) from e
    return info


def _by_fairpipe(info) -> bool:
    """Whether snapshot ``info`` was committed by fairpipe, as its message and metadata tell
    (what a damaged record key cannot hide: the other keys and the message stay)."""
    return info.message == CREATED or any(
        str(k).startswith("fairpipe") for k in info.metadata or {}
    )


def lineage_problem(info, parent) -> tuple[str, str] | None:
    """(what, why) is wrong with snapshot ``info`` and its ``parent`` (``SnapshotInfo``s;
    None: it has none), as its record and Icechunk's first snapshot let tell: no record where
    its parent has one (a damaged snapshot whose record is gone); a parent other than its
    commit recorded, or whose time differs from what it recorded (the one thing of a snapshot
    its own record cannot hold); the repository's first snapshot not as Icechunk writes it.
    None where nothing is."""
    if parent is None:
        first, message, metadata = FIRST_SNAPSHOT
        if info.id == first and (info.message != message or dict(info.metadata or {}) != metadata):
            return f"Snapshot {info.id}", FIRST_DIFFERS
        return None
    record = (info.metadata or {}).get(RECORD_KEY)
    if record is None:
        # (a commit made without fairpipe, through Icechunk itself, has none either)
        if RECORD_KEY in (parent.metadata or {}) and _by_fairpipe(info):
            return f"Snapshot {info.id}", RECORD_MISSING.format(parent=parent.id)
        return None
    # (expiring history makes the first snapshot the parent of the oldest kept: not checked)
    if parent.id == FIRST_SNAPSHOT[0] or "parent" not in record:
        return None
    if record["parent"][0] != parent.id:
        return f"Snapshot {info.id}", OTHER_PARENT.format(parent=parent.id)
    if record["parent"][1] != parent.written_at.isoformat():
        return f"Snapshot {parent.id}", OTHER_TIME.format(child=info.id)
    return None


def snapshot_record(info) -> dict | None:
    """The record of snapshot ``info`` once :func:`record_problem` finds nothing wrong with it
    (a :class:`DamagedMetadataError` naming the snapshot otherwise); None where it has none."""
    problem = record_problem(info)
    if problem is not None:
        raise DamagedMetadataError(f"Snapshot {info.id}", problem)
    record = (info.metadata or {}).get(RECORD_KEY)
    _EXPECTED[info.id] = record
    return record


def expect(repo, snapshot_id: str) -> None:
    """Note snapshot ``snapshot_id``'s record, checked, so that the arrays read from it are
    checked against it (:func:`check_array`). A snapshot without one is checked against its
    parent (:func:`lineage_problem`)."""
    if snapshot_id in _EXPECTED:
        return
    info = _lookup(repo, snapshot_id)
    if RECORD_KEY not in (info.metadata or {}):
        parent = _lookup(repo, info.parent_id) if info.parent_id else None
        problem = lineage_problem(info, parent)
        if problem is not None:
            raise DamagedMetadataError(*problem)
    snapshot_record(info)


def snapshots_opened() -> list[str]:
    """The snapshots this process opened for reading (:func:`expect`)."""
    return list(_EXPECTED)


def _is_read_only(session) -> bool:
    return bool(getattr(session, "read_only", True))  # a fairpipe.storage.light session: always


def array_problem(session, path: str, record: dict) -> tuple[str, str] | None:
    """(what, why) is wrong with array ``path`` of a session against its snapshot's
    ``record``, or None."""
    get, run = _source(session)
    snapshot = session.snapshot_id
    entry = record["arrays"].get(path)
    if entry is None:
        try:
            stored = run(lambda: _group_entry(get, path))
        except Exception as e:
            raise_damage(e)
            raise
        if stored is None:  # absent, as its commit wrote it: zarr says it is not there
            return None
        return f"Array '{path}'", NOT_RECORDED.format(snapshot=snapshot)
    try:
        found = run(lambda: _array_entry(session, get, path))
    except Exception as e:
        damage = damaged_store_error(e)
        # (Icechunk's report of a manifest it cannot read, listed so, names no array)
        if isinstance(damage, DamagedMetadataError) and damage.what.startswith(
            ("Manifest ", "A manifest")
        ):
            raise DamagedMetadataError(f"The manifest of array '{path}'", damage.why) from e
        raise_damage(e)
        raise
    if found[2] != entry[2]:
        return f"The metadata of array '{path}'", META_DIFFERS.format(snapshot=snapshot)
    if found[0] != entry[0]:
        why = COUNT_DIFFERS.format(found=found[0], snapshot=snapshot, written=entry[0])
        return f"The manifest of array '{path}'", why
    if found[1] != entry[1]:
        return f"The manifest of array '{path}'", COORDS_DIFFER.format(snapshot=snapshot)
    return None


def check_array(session, path: str) -> None:
    """Raise a :class:`DamagedMetadataError` where array ``path`` of a read-only ``session``
    is not what its commit recorded: its chunks as its manifest lists them, or its metadata.
    Once per array and session; nothing for a snapshot without a record, or one
    no store opened for reading (:func:`expect`)."""
    if not _EXPECTED:
        return
    snapshot = session.snapshot_id
    record = _EXPECTED.get(snapshot)
    if record is None or not _is_read_only(session) or path in _checked(session):
        return
    problem = array_problem(session, path, record)
    if problem is not None:
        raise DamagedMetadataError(*problem)
    _checked(session).add(path)


def group_problems(session, record: dict) -> list[tuple[str, str]]:
    """(what, why) of each group of ``record`` whose metadata in the session is not what its
    commit wrote (or is gone)."""
    snapshot = session.snapshot_id
    paths = list(record["groups"])
    found = [None if meta is None else _digest(meta) for meta in _stored_metadata(session, paths)]
    out = []
    for path, digest in zip(paths, found):
        name = f"group '{path}'" if path else "the root group"
        if digest is None:
            out.append((f"The metadata of {name}", GROUP_GONE.format(snapshot=snapshot)))
        elif digest != record["groups"][path]:
            out.append((f"The metadata of {name}", META_DIFFERS.format(snapshot=snapshot)))
    return out


def check_groups(session) -> None:
    """:func:`check_array` for the metadata of every node of the session's snapshot, groups and
    arrays (as stored: before zarr reads any of it, through the root group and its members)."""
    if not _EXPECTED:
        return
    snapshot = session.snapshot_id
    record = _EXPECTED.get(snapshot)
    if record is None or not _is_read_only(session) or "/" in _checked(session):
        return
    problems = group_problems(session, record)
    problems += [problem for _, problem in _metadata_problems(session, record)]
    if problems:
        raise DamagedMetadataError(*problems[0])
    _checked(session).add("/")


def _stored_metadata(session, paths: list[str]) -> list[bytes | None]:
    """The metadata (``zarr.json``) of each node of ``paths`` as stored in a session, fetched at
    once (None for a node that is not there); the damage met on the way raised as such."""
    get, run = _source(session)

    async def listed() -> list:
        import asyncio

        return await asyncio.gather(*(get(_meta_key(p)) for p in paths))

    try:
        found = run(listed)
    except Exception as e:
        raise_damage(e)
        raise
    return [None if meta is None else bytes(meta) for meta in found]


def _metadata_problems(session, record: dict) -> list[tuple[str, tuple[str, str]]]:
    """(array, (what, why)) of each array of ``record`` whose metadata, as stored, is not what
    its commit wrote (or is gone)."""
    paths = list(record["arrays"])
    out = []
    for path, meta in zip(paths, _stored_metadata(session, paths)):
        if meta is None or _digest(meta) != record["arrays"][path][2]:
            why = (GROUP_GONE if meta is None else META_DIFFERS).format(
                snapshot=session.snapshot_id
            )
            out.append((path, (f"The metadata of array '{path}'", why)))
    return out
