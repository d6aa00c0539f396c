"""The direct chunk path's cost, with and without a crc32c checksum per chunk: run

    .venv/bin/python benchmarks/bench_chunks.py [--rows 1000000] [--d 128] [--repeat 3]

On an array of float32 points (n x d, chunks of 2048 rows, as a store keeps them) and one of its
uint8 sketch (n x (d + 12), chunks of 4096 rows), each stored without a compressor, once plainly
and once with a crc32c checksum as the last codec (what every array of a store carries): the
time to write all rows (storage.store.write_rows, one block), to read them all back
(storage.store.read_arrays), and to read 20,000 scattered rows (storage.store.read_rows_at: a
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

from storage.store import (  # noqa: E402
    FairpipeStore,
    _plain_chunks,
    open_array,
    open_group,
    read_arrays,
    read_rows_at,
    write_rows,
)


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from zarr.codecs import Crc32cCodec

    rng = np.random.default_rng(0)
    n, d = args.rows, args.d
    values = {
        "points": (rng.normal(size=(n, d)).astype(np.float32), 2048),
        "sketch": (rng.integers(0, 256, size=(n, d + 12), dtype=np.uint8), 4096),
    }
    scattered = np.sort(rng.choice(n, size=min(n, 20_000), replace=False))
    print(f"{n} rows, d = {d}; best of {args.repeat}")
    print(f"  {'array':<8} {'checksum':<9} {'write':>8} {'read all':>9} {'20k rows':>9} "
          f"{'zarr read':>10} {'encode':>8} {'decode':>8}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        store = FairpipeStore.open(str(Path(tmp) / "s"), create=True)
        for name, (X, block) in values.items():
            for label, codecs in (("none", None), ("crc32c", Crc32cCodec())):
                path = f"{name}_{label}"
                s = store.repo.writable_session("main")
                open_group(s, mode="a").create_array(
                    path, shape=X.shape, chunks=(block, X.shape[1]), dtype=X.dtype,
                    compressors=codecs,
                )  # fmt: skip
                write = best_of(lambda s=s, path=path, X=X: write_rows(s, path, 0, X), args.repeat)
                s.commit(path)
                r = store.readonly_session()
                read_all = best_of(lambda r=r, path=path: read_arrays(r, [path]), args.repeat)
                rows = best_of(lambda r=r, path=path: read_rows_at(r, path, scattered), args.repeat)
                by_zarr = best_of(lambda r=r, path=path: open_array(r, path)[...], args.repeat)
                assert np.array_equal(read_arrays(r, [path])[0], X)
                plain = _plain_chunks(open_array(r, path))
                assert plain is not None and plain.checksum == (codecs is not None)
                parts = [X[a : a + block] for a in range(0, n - block + 1, block)]
                stored = [plain.encode(part) for part in parts]
                encode = best_of(lambda p=plain, parts=parts: [p.encode(x) for x in parts],
                                 args.repeat)  # fmt: skip
                decode = best_of(lambda p=plain, stored=stored: [p.decode(b) for b in stored],
                                 args.repeat)  # fmt: skip
                print(f"  {name:<8} {label:<9} {write:>7.3f}s {read_all:>8.3f}s {rows:>8.3f}s "
                      f"{by_zarr:>9.3f}s {encode:>7.3f}s {decode:>7.3f}s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
