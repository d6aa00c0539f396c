"""The rows of a dataset and their LSH bucket index in the store.

Layout (store format 1):

- ``points`` float32 (n, d), ``ids`` int64 (n,), ``groups`` int32 (n,), ``alive`` bool (n,), all
  chunked by rows (``chunk_rows``); group names and parameters in the root attributes;
- ``lsh/keys`` uint64 (n, L): each point's bucket key per table (row chunks);
- ``lsh/projections`` (d, L*k), ``lsh/offsets`` (L*k,), ``lsh/multipliers`` (k,): the hash
  functions (:meth:`fairpipe.neighbors.E2LSH.to_arrays`); their parameters in the root attribute
  ``lsh`` as ``{"k", "n_tables", "width", "seed"}`` (the library's ``n_hashes`` and
  ``bucket_width`` are stored as ``k`` and ``width``);
- ``lsh/members`` int64 (L, n): per table, the rows sorted by key (padded with -1 past the alive
  rows); ``lsh/bucket_keys`` uint64 (L, n) and ``lsh/bucket_starts`` int64 (L, n + 1): per table
  its sorted distinct keys and where each bucket starts in ``members`` (padded);
  ``lsh/bucket_counts`` int64 (L,): how many buckets each table has. One table per chunk row, so
  tables are written in parallel without sharing a chunk.

A forgotten row keeps its place (row numbers are stable) but is erased: points zeroed, keys set to
``ERASED_KEY``, group -1, ``alive`` false, and it leaves every bucket.
"""

from __future__ import annotations

import numpy as np

from fairpipe.neighbors import E2LSH, ROW_BLOCK, BucketIndex, FairNN, build_table, remove_rows
from storage.store import FORMAT, read_array, read_rows_at, write_rows, write_table_rows

TARGET_CHUNK_BYTES = 16 << 20
EMPTY_KEY = np.iinfo(np.uint64).max
ERASED_KEY = EMPTY_KEY
INDEX_BLOCK_BYTES = 256 << 20  # index arrays one job holds at most
# The library's names of E2LSH's parameters -> their names in the store's ``lsh`` attribute.
LSH_STORE_NAMES = {"n_hashes": "k", "n_tables": "n_tables", "bucket_width": "width", "seed": "seed"}


def choose_chunk_rows(d: int) -> int:
    """Rows per chunk: about 16 MB of points, a multiple of the hashing block."""
    rows = TARGET_CHUNK_BYTES // max(4 * d, 1)
    return int(min(max(rows // ROW_BLOCK * ROW_BLOCK, ROW_BLOCK), 65536))


# -- the hash functions ---------------------------------------------------------------------------
def lsh_attrs(lsh: E2LSH) -> dict:
    """The ``lsh`` root attribute of a store for these hash functions."""
    params = lsh.get_params()
    return {store: params[name] for name, store in LSH_STORE_NAMES.items()}


def load_lsh(session, attrs: dict) -> E2LSH:
    """The store's hash functions (``attrs``: the root attributes)."""
    params = {name: attrs["lsh"][store] for name, store in LSH_STORE_NAMES.items()}
    arrays = {name: read_array(session, f"lsh/{name}") for name in ("projections", "offsets",
                                                                    "multipliers")}  # fmt: skip
    return E2LSH.from_arrays(arrays, **params)


# -- writing rows ---------------------------------------------------------------------------------
def create_layout(root, d: int, lsh: E2LSH, chunk_rows: int) -> None:
    """The empty arrays of a new store, and its hash functions."""
    L = lsh.n_tables
    root.create_array("points", shape=(0, d), chunks=(chunk_rows, d), dtype="float32")
    root.create_array("ids", shape=(0,), chunks=(chunk_rows,), dtype="int64")
    root.create_array("groups", shape=(0,), chunks=(chunk_rows,), dtype="int32")
    root.create_array("alive", shape=(0,), chunks=(chunk_rows,), dtype="bool")
    root.create_group("lsh")
    root.create_array("lsh/keys", shape=(0, L), chunks=(chunk_rows, L), dtype="uint64")
    for name, arr in lsh.to_arrays().items():
        root.create_array(f"lsh/{name}", shape=arr.shape, dtype=arr.dtype)[...] = arr


def grow(root, n_total: int, n_tables: int) -> None:
    """Make room for ``n_total`` rows: the row arrays grow; the index arrays are made anew,
    empty, at the new size (the index is rebuilt after the rows are written)."""
    for name in ("points", "ids", "groups", "alive", "lsh/keys"):
        arr = root[name]
        arr.resize((n_total, *arr.shape[1:]))
    index_chunk = min(max(n_total, 1), 1 << 22)
    for name, extra, fill, dtype in (
        ("lsh/members", 0, -1, "int64"),
        ("lsh/bucket_keys", 0, EMPTY_KEY, "uint64"),
        ("lsh/bucket_starts", 1, 0, "int64"),
    ):
        if name in root:
            del root[name]
        root.create_array(name, shape=(n_tables, n_total + extra), chunks=(1, index_chunk + extra),
                          dtype=dtype, fill_value=fill)  # fmt: skip


def row_chunks(base: int, n_total: int, chunk_rows: int) -> list[tuple[int, int]]:
    """Row ranges of new rows [base, n_total), relative to ``base``, aligned to the store's row
    chunks so that no two writers share a Zarr chunk."""
    edges = list(range(base, n_total, chunk_rows))
    if base % chunk_rows:
        first = (base // chunk_rows + 1) * chunk_rows
        edges = [base, *range(first, n_total, chunk_rows)]
    edges.append(n_total)
    return [(a - base, b - base) for a, b in zip(edges[:-1], edges[1:])]


def write_new_rows(session, start: int, points, ids, groups, keys) -> None:
    """Write new (live) rows at ``start``: points, ids, groups and LSH keys."""
    write_rows(session, "points", start, points)
    write_rows(session, "ids", start, ids)
    write_rows(session, "groups", start, groups)
    write_rows(session, "alive", start, np.ones(points.shape[0], dtype=bool))
    write_rows(session, "lsh/keys", start, keys)


def erase_rows(session, root, rows: np.ndarray, chunk_rows: int) -> None:
    """Erase the live ``rows`` (sorted) in place, chunk by chunk: points zeroed, keys
    overwritten, groups -1, alive false; the root's ``n_alive`` drops by their number."""
    root.attrs["n_alive"] = int(root.attrs["n_alive"]) - int(rows.size)
    erased = (("points", 0.0), ("lsh/keys", ERASED_KEY), ("groups", -1), ("alive", False))
    for c in np.unique(rows // chunk_rows):
        a = int(c) * chunk_rows
        sel = rows[(rows >= a) & (rows < a + chunk_rows)] - a
        for name, value in erased:
            block = read_array(session, name, slice(a, a + chunk_rows))
            block[sel] = value
            write_rows(session, name, a, block)


def write_dataset_attrs(root, before: dict, *, n: int, n_alive: int, d: int, seed: int,
                        chunk_rows: int, group_names: list[str], lsh: E2LSH,
                        suggested_radius: float, source: str) -> dict:  # fmt: skip
    """The root attributes after an ingest (``before``: those it started from); returns them."""
    meta = {
        "fairpipe_format": FORMAT,
        "n": n,
        "n_alive": n_alive,
        "d": d,
        "seed": seed,
        "chunk_rows": chunk_rows,
        "group_names": group_names,
        "lsh": lsh_attrs(lsh),
        "suggested_radius": suggested_radius,
        "sources": [*before.get("sources", []), source],
    }
    root.attrs.update(meta)
    return meta


# -- the bucket index -----------------------------------------------------------------------------
def table_blocks(n_tables: int, n_rows: int) -> list[tuple[int, int]]:
    """Blocks of tables [t0, t1) small enough that a job holds about 256 MB of index at most
    (and at least 8 blocks where there are that many tables, to spread the work)."""
    per_job = int(max(1, min(n_tables, INDEX_BLOCK_BYTES // max(40 * n_rows, 1),
                             -(-n_tables // 8))))  # fmt: skip
    return [(t, min(t + per_job, n_tables)) for t in range(0, n_tables, per_job)]


def index_tables(session, t0: int, t1: int) -> dict[int, int]:
    """Index tables [t0, t1) from the keys of the live rows: one read of their key columns, one
    write per index array. Returns each table's bucket count."""
    alive = read_array(session, "alive")
    keys = read_array(session, "lsh/keys", (slice(None), slice(t0, t1)))
    n = alive.shape[0]
    bkeys = np.full((t1 - t0, n), EMPTY_KEY, dtype=np.uint64)
    bstarts = np.zeros((t1 - t0, n + 1), dtype=np.int64)
    members = np.full((t1 - t0, n), -1, dtype=np.int64)
    counts = {}
    for j in range(t1 - t0):
        k, s, m = build_table(keys[:, j], alive)
        bkeys[j, : k.shape[0]] = k
        bstarts[j, : s.shape[0]] = s
        members[j, : m.shape[0]] = m
        counts[t0 + j] = k.shape[0]
    write_table_rows(session, "lsh/bucket_keys", t0, bkeys)
    write_table_rows(session, "lsh/bucket_starts", t0, bstarts)
    write_table_rows(session, "lsh/members", t0, members)
    return counts


def write_bucket_counts(root, counts: np.ndarray) -> None:
    if "lsh/bucket_counts" in root:
        del root["lsh/bucket_counts"]
    root.create_array("lsh/bucket_counts", shape=counts.shape, dtype="int64")[:] = counts


def remove_from_index(session, root, rows: np.ndarray, n_tables: int, n_rows: int,
                      n_indexed: int) -> np.ndarray:  # fmt: skip
    """Drop ``rows`` from every table's buckets in place, in blocks of tables of bounded memory:
    one pass over each table and no sort (:func:`fairpipe.neighbors.remove_rows`), giving the
    arrays a rebuild would. ``n_indexed`` rows are in each table now (the live rows before the
    deletion). Returns the new bucket count of each table."""
    dead = np.zeros(n_rows, dtype=bool)
    dead[rows] = True
    counts = read_array(session, "lsh/bucket_counts").astype(np.int64)
    per_block = int(max(1, min(n_tables, INDEX_BLOCK_BYTES // max(24 * n_rows, 1))))
    for t0 in range(0, n_tables, per_block):
        t1 = min(t0 + per_block, n_tables)
        block = (slice(t0, t1), slice(None))
        K = read_array(session, "lsh/bucket_keys", block)
        S = read_array(session, "lsh/bucket_starts", block)
        M = read_array(session, "lsh/members", block)
        for j in range(t1 - t0):
            c = int(counts[t0 + j])
            k, st, m = remove_rows(K[j, :c], S[j, : c + 1], M[j, :n_indexed], dead)
            K[j], S[j], M[j] = EMPTY_KEY, 0, -1
            K[j, : k.shape[0]], S[j, : st.shape[0]], M[j, : m.shape[0]] = k, st, m
            counts[t0 + j] = k.shape[0]
        write_table_rows(session, "lsh/bucket_keys", t0, K)
        write_table_rows(session, "lsh/bucket_starts", t0, S)
        write_table_rows(session, "lsh/members", t0, M)
    root["lsh/bucket_counts"][:] = counts
    return counts


def load_index(session, n_alive: int) -> BucketIndex:
    """Every table's buckets, unpadded and concatenated."""
    counts = read_array(session, "lsh/bucket_counts")
    keys = read_array(session, "lsh/bucket_keys")
    starts = read_array(session, "lsh/bucket_starts")
    members = read_array(session, "lsh/members")
    tables = [
        (keys[t, : counts[t]], starts[t, : counts[t] + 1], members[t, :n_alive])
        for t in range(counts.shape[0])
    ]
    return BucketIndex.from_tables(tables)


def load_sampler(session, attrs: dict) -> FairNN:
    """A :class:`FairNN` over the store's rows and index (everything read into memory)."""
    lsh = load_lsh(session, attrs)
    index = load_index(session, int(attrs["n_alive"]))
    arrays = {
        **lsh.to_arrays(),
        "points": read_array(session, "points"),
        "ids": read_array(session, "ids"),
        "alive": read_array(session, "alive"),
        "keys": read_array(session, "lsh/keys"),
        "bucket_keys": index.bucket_keys,
        "bucket_starts": index.starts,
        "members": index.members,
    }
    return FairNN.from_arrays(arrays, **lsh.get_params())


# -- reading rows ---------------------------------------------------------------------------------
def n_features(session) -> int:
    return int(read_array(session, "points", slice(0, 1)).shape[1])


def read_live_rows(session, a: int, b: int, rows: np.ndarray | None = None):
    """(points, ids, groups) of the live rows of [a, b) (only those in ``rows`` if given)."""
    ids = read_array(session, "ids", slice(a, b))
    keep = read_array(session, "alive", slice(a, b))
    if rows is not None:
        keep &= np.isin(np.arange(a, b), rows)
    if not keep.any():
        return np.zeros((0, n_features(session)), np.float32), ids[:0], np.zeros(0, np.int32)
    X = read_array(session, "points", slice(a, b))[keep]
    return X, ids[keep], read_array(session, "groups", slice(a, b))[keep]


def read_all_live(session):
    """(points, ids) of every live row (memory n x d: for the global Q-k-means model)."""
    alive = read_array(session, "alive")
    return read_array(session, "points")[alive], read_array(session, "ids")[alive]


def points_and_groups_of(session, lookup, ids: np.ndarray):
    """(points float64, groups int64) of the stored rows holding ``ids`` (sorted, all known);
    only the chunks holding them are read."""
    rows, _ = lookup.rows(ids)
    order = np.argsort(rows)
    X = np.empty((ids.shape[0], n_features(session)), dtype=np.float64)
    groups = np.empty(ids.shape[0], dtype=np.int64)
    X[order] = read_rows_at(session, "points", rows[order])
    groups[order] = read_rows_at(session, "groups", rows[order])
    return X, groups


def live_group_counts(session, n_groups: int) -> list[int]:
    """Live rows per group (a forgotten row's group is -1)."""
    groups = read_array(session, "groups")[read_array(session, "alive")]
    return np.bincount(groups, minlength=max(n_groups, 1)).tolist()
