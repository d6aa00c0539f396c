"""The direct chunk path's cost, with and without a crc32c checksum per chunk: run

    .venv/bin/python benchmarks/bench_chunks.py [--rows 1000000] [--d 128] [--repeat 3]

On an array of float32 points (n x d, chunks of 2048 rows, as a store keeps them) and one of its
uint8 sketch (n x (d + 12), chunks of 4096 rows), each stored without a compressor, once plainly
and once with a crc32c checksum as the last codec (what every array of a store carries): the
time to write all rows (fairpipe.storage.writes.write_rows, one block), to read them all back
(fairpipe.storage.arrays.read_arrays), and to read 20,000 scattered rows (fairpipe.storage.arrays.read_rows_at: a
query's candidates), best of ``--repeat``; zarr's own whole read of the same array for
reference; and the CPU alone: encoding and decoding every chunk in memory (the direct path's
codecs, checksum included), which is what the checksum adds, without the store's I/O (the I/O
varies by tens of percent from run to run on a shared machine). Nothing is asserted: the
figures are printed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fairpipe.storage.arrays import open_array, open_group, read_arrays, read_rows_at  # noqa: E402
from fairpipe.storage.chunks import _plain_chunks  # noqa: E402
from fairpipe.storage.store import FairpipeStore  # noqa: E402
from fairpipe.storage.writes import write_rows  # noqa: E402


def timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def encode_all(plain, parts) -> list:
    return [plain.encode(x) for x in parts]


def decode_all(plain, stored) -> list:
    return [plain.decode(b) for b in stored]


def measure(store, name: str, X: np.ndarray, block: int, scattered: np.ndarray,
            repeat: int) -> None:  # fmt: skip
    """One array's figures, without and with the checksum, each variant in turn (a load that
    drifts hits both)."""
    from zarr.codecs import Crc32cCodec

    variants = {"none": None, "crc32c": Crc32cCodec()}
    best: dict[str, dict[str, float]] = {label: {} for label in variants}

    def keep(label: str, what: str, t: float) -> None:
        best[label][what] = min(best[label].get(what, t), t)

    s = store.repo.writable_session("main")
    for label, codecs in variants.items():
        open_group(s, mode="a").create_array(
            f"{name}_{label}", shape=X.shape, chunks=(block, X.shape[1]), dtype=X.dtype,
            compressors=codecs,
        )  # fmt: skip
    for _ in range(repeat):
        for label in variants:
            keep(label, "write", timed(write_rows, s, f"{name}_{label}", 0, X))
    s.commit(name)
    r = store.readonly_session()
    plains = {label: _plain_chunks(open_array(r, f"{name}_{label}")) for label in variants}
    parts = [X[a : a + block] for a in range(0, X.shape[0] - block + 1, block)]
    stored = {label: encode_all(p, parts) for label, p in plains.items() if p is not None}
    for _ in range(repeat):
        for label, plain in plains.items():
            path = f"{name}_{label}"
            keep(label, "read all", timed(read_arrays, r, [path]))
            keep(label, "20k rows", timed(read_rows_at, r, path, scattered))
            keep(label, "zarr read", timed(open_array(r, path).__getitem__, ...))
            if plain is not None:  # the direct path's codecs alone, in memory
                keep(label, "encode", timed(encode_all, plain, parts))
                keep(label, "decode", timed(decode_all, plain, stored[label]))
    for label in variants:
        assert np.array_equal(read_arrays(r, [f"{name}_{label}"])[0], X)
        b = best[label]
        cpu = (f"{b['encode']:>7.3f}s {b['decode']:>7.3f}s" if "encode" in b
               else "       -        -")  # fmt: skip
        print(f"  {name:<8} {label:<9} {b['write']:>7.3f}s {b['read all']:>8.3f}s "
              f"{b['20k rows']:>8.3f}s {b['zarr read']:>9.3f}s {cpu}", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n, d = args.rows, args.d
    values = {
        "points": (rng.normal(size=(n, d)).astype(np.float32), 2048),
        "sketch": (rng.integers(0, 256, size=(n, d + 12), dtype=np.uint8), 4096),
    }
    scattered = np.sort(rng.choice(n, size=min(n, 20_000), replace=False))
    print(f"{n} rows, d = {d}; best of {args.repeat}, the two variants measured in turn")
    print(f"  {'array':<8} {'checksum':<9} {'write':>8} {'read all':>9} {'20k rows':>9} "
          f"{'zarr read':>10} {'encode':>8} {'decode':>8}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        store = FairpipeStore.open(str(Path(tmp) / "s"), create=True)
        for name, (X, block) in values.items():
            measure(store, name, X, block, scattered, args.repeat)


if __name__ == "__main__":
    main()
