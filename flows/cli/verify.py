"""``fairpipe verify``: check a store's snapshots and manifests against what their commits
recorded, and every chunk against its checksum."""

from __future__ import annotations

import contextlib

import typer

from fairpipe.flows.cli._options import Store
from fairpipe.flows.cli._output import emit, result_console
from fairpipe.flows.cli._runner import CORRUPT_STORE, Shared, command
from fairpipe.settings import ADD_CHECKSUMS


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # unreachable


def _render(r: dict) -> None:
    out = result_console()
    out.print(f"{r['store']} at {r['snapshot']}: {r['snapshots']} snapshots and their manifests "
              f"checked; {r['chunks']} chunks of {r['arrays']} arrays checked "
              f"({_size(r['bytes'])})")  # fmt: skip
    for d in r["damaged"]:
        out.print(f"damaged: {d['what']} (snapshot {d['snapshot']}): {d['why']}")
    if r["unrecorded"]:
        out.print(f"{r['unrecorded']} snapshots were written before commits recorded their "
                  "manifests: their chunks are counted against Icechunk's count only")  # fmt: skip
    for c in r["corrupt"]:
        what = "" if c["chunk"] is None else f"chunk ({', '.join(map(str, c['chunk']))}) of "
        out.print(f"corrupt: {what}array '{c['array']}': {c['why']}")
    if r["n_corrupt"] > len(r["corrupt"]):
        out.print(f"... and {r['n_corrupt'] - len(r['corrupt'])} more corrupt chunks")  # fmt: skip
    if r["unverifiable"]:
        names = ", ".join(u["array"] for u in r["unverifiable"])
        out.print(f"without a checksum (decoded, not verified): {names}")
        if not r["n_corrupt"] and not r.get("added"):
            out.print(f"'fairpipe verify --store {r['store']} --add-checksums' gives them one")  # fmt: skip
    if r.get("added"):
        a = r["added"]
        out.print(f"checksums added to {len(a['arrays'])} arrays ({a['chunks']} chunks) in "
                  f"commit {a['commit']}")  # fmt: skip
    n = r["n_corrupt"]
    lists = any(c["chunk"] is None for c in r["corrupt"])
    what = f"corrupt chunk{'s' if n > 1 else ''}" + (" or chunk lists" if lists else "")
    verdict = f"{n} {what}" if n else "no corrupt chunk"
    damaged = len(r["damaged"])
    verdict += (f", {damaged} damaged snapshot{'s' if damaged > 1 else ''} or manifest"
                f"{'s' if damaged > 1 else ''}" if damaged else ", no damaged snapshot or manifest")  # fmt: skip
    out.print(verdict)


@contextlib.contextmanager
def _progress(enabled: bool):
    """A callback ``(array, arrays done, arrays, chunks checked)`` advancing a bar on stderr (or
    None)."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True),
                  transient=True) as bar:  # fmt: skip
        task = bar.add_task("arrays", total=None)

        def update(array: str, done: int, total: int, chunks: int) -> None:
            bar.update(task, completed=done, total=total,
                       description=f"{chunks} chunks checked {array}")  # fmt: skip

        yield update


@command(shared=("lock_timeout", "as_json"), settings=(ADD_CHECKSUMS,))
def verify(store: Store, *, shared: Shared, add_checksums: bool) -> None:
    """Check the store's snapshots and manifests against what their commits recorded, and every
    chunk of its current snapshot against its checksum (exit 4: something is damaged).

    \b
    Example (a store made by 'fairpipe ingest digits --store digits.store'):
      fairpipe verify --store digits.store
    """
    from fairpipe.storage.integrity import add_checksums as add
    from fairpipe.storage.integrity import verify_store
    from fairpipe.storage.store import FairpipeStore

    st = FairpipeStore.open(store)
    with _progress(not shared.as_json) as progress:
        result = verify_store(st, progress=progress)
    damaged = result["n_corrupt"] or result["damaged"]
    if add_checksums and result["unverifiable"] and not damaged:
        result["added"] = add(st, lock_timeout=shared.lock_timeout)
    emit(result, shared.as_json, _render)
    if damaged:
        raise typer.Exit(CORRUPT_STORE)
