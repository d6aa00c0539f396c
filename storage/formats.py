"""The store's format: the number its root attributes name, and the format 1 index (uint64
``lsh/keys`` and (L, n) padded index arrays), read as it is and upgraded to format 2 (the
segments of :mod:`fairpipe.storage.segments`) by the next write."""

from __future__ import annotations

import numpy as np

from fairpipe.neighbors import BucketIndex, build_segments, partition_bits
from fairpipe.storage.arrays import read_array
from fairpipe.storage.segments import (
    bucket_count,
    create_index,
    write_bucket_counts,
    write_segment_lengths,
    write_tables,
)
from fairpipe.storage.store import FORMAT


def store_format(attrs: dict) -> int:
    """The format of a store (``attrs``: its root attributes; the current one where they name
    none)."""
    return int(attrs.get("fairpipe_format", FORMAT))


def load_format1_index(session, n_alive: int) -> BucketIndex:
    """Every table's buckets of a format 1 store (``n_alive``: the members each table holds),
    as :func:`fairpipe.storage.index.load_index` gives them."""
    counts = read_array(session, "lsh/bucket_counts")
    keys = read_array(session, "lsh/bucket_keys")
    starts = read_array(session, "lsh/bucket_starts")
    members = read_array(session, "lsh/members")
    tables = [
        (keys[t, : counts[t]], starts[t, : counts[t] + 1], members[t, :n_alive])
        for t in range(counts.shape[0])
    ]
    return BucketIndex.from_tables(tables)


def upgrade_format1(session, root, attrs: dict) -> dict:
    """The root attributes of a store whose index is format 2: a format 1 store's index is
    rebuilt as segments (from its stored keys) and its old arrays dropped, in the caller's
    transaction (a store already in format 2 is left as it is)."""
    if store_format(attrs) != 1:
        return attrs
    keys = read_array(session, "lsh/keys")
    alive = read_array(session, "alive")
    rows = np.flatnonzero(alive)
    n_tables = keys.shape[1]
    bits = partition_bits(rows.shape[0])
    create_index(root, n_tables)  # drops keys, members, bucket_* as well
    lengths = np.zeros((n_tables, 1 << bits), dtype=np.int32)
    counts = np.zeros(n_tables, dtype=np.int64)
    for t in range(n_tables):
        flat, offsets = build_segments(keys[rows, t], rows, bits)
        lengths[t] = write_tables(session, t, [(flat, offsets)], [np.zeros(0, np.int32)])[0]
        counts[t] = bucket_count(flat, offsets)
    write_segment_lengths(root, lengths)
    write_bucket_counts(root, counts)
    root.attrs.update({"fairpipe_format": FORMAT, "lsh": {**attrs["lsh"], "segment_bits": bits}})
    return dict(root.attrs)
