"""``fairpipe request-deletion``, ``receipts``, ``status`` and ``configure``: the deletion queue
of a store, and its erasure setting."""

from __future__ import annotations

from fairpipe.errors import FairpipeInputError
from fairpipe.flows.cli._options import Store, check_ids_given
from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import Shared, command
from fairpipe.settings import (
    ERASURE_RETENTION,
    EXTEND_RADIUS,
    GIVEN_IDS,
    REQUEST,
    REQUEST_REASON,
)

UNKNOWN_REQUEST = "There is no receipt for request {rid} in the store {url}{pending}."


def _render_request(r: dict) -> None:
    result_console().print(
        f"request {r['request']} filed: {r['n_ids']} ids (applied by the next "
        f"'fairpipe forget --store {r['store']}')",
    )


def _check_request(**o) -> None:
    check_ids_given(o["ids"], o["ids_file"])


@command(render=_render_request, check=_check_request, settings=(*GIVEN_IDS, REQUEST_REASON))
def request_deletion(
    store: Store, *, shared: Shared, ids: str | None, ids_file: str | None, reason: str
) -> dict:
    """File a deletion request (durable when this returns); a drain applies it ('fairpipe
    forget'). Give one of --ids or --ids-file.

    \b
    Example (a store made by 'fairpipe ingest digits --store digits.store'):
      fairpipe request-deletion --store digits.store --ids 7,8 --reason "asked by email"
    """
    from fairpipe.datasets import read_ids
    from fairpipe.storage.queue import file_request
    from fairpipe.storage.store import FairpipeStore

    wanted = read_ids(text=ids, path=ids_file)
    FairpipeStore.open(store).require_data()
    req = file_request(store, wanted, reason)
    return {"store": store, "request": req.request_id, "n_ids": int(req.ids.size),
            "requested_at": req.requested_at}  # fmt: skip


def _render_set_aside(aside: dict) -> None:
    out = result_console()
    if aside["unlistable"]:
        out.print(f"queue objects whose keys are not valid object paths (delete them with the "
                  f"bucket's own tools): {', '.join(aside['unlistable'])}")  # fmt: skip
    if not aside["count"]:
        return
    out.print(f"{aside['count']} queue objects set aside as not deletion requests (never "
              f"applied; look at them, then delete them): {aside['where']}")  # fmt: skip
    for note in aside["objects"]:
        out.print(f"  '{note['object']}' -> {note['moved_to']}: {note['why']}")


def _render_receipts(r: dict) -> None:
    out = result_console()
    for x in r["receipts"]:
        out.print(
            f"{x['request']}: {x['n_ids']} ids ({len(x['not_found'])} not found), requested "
            f"{x['requested_at']}, applied {x['applied_at']} in {x['commit']}, erased from "
            f"history {x['erased_at'] or 'not yet'}"
            + (f", reason: {x['reason']}" if x["reason"] else ""),
        )
    if not r["receipts"]:
        out.print("no receipts")
    _render_set_aside(r["set_aside"])


@command(render=_render_receipts, read_only=True, settings=(REQUEST,))
def receipts(store: Store, *, shared: Shared, request: str | None) -> dict:
    """The receipts of applied deletion requests (ids and times, never the erased data).

    \b
    Example (a store made by 'fairpipe ingest digits --store digits.store'):
      fairpipe receipts --store digits.store --json
    """
    from fairpipe.storage.queue import pending
    from fairpipe.storage.receipts import read_receipts
    from fairpipe.storage.store import FairpipeStore

    st = FairpipeStore.open(store)
    st.require_data()
    found = read_receipts(st.readonly_session())
    if request is not None:
        found = [r for r in found if r["request"] == request]
        if not found:
            waiting = (
                " (it is pending: run 'fairpipe forget' to apply it)"
                if request in pending(store)
                else ""
            )
            raise FairpipeInputError(UNKNOWN_REQUEST.format(rid=request, url=store,
                                                            pending=waiting))  # fmt: skip
    from fairpipe.flows.status import set_aside_of

    return {"receipts": found, "set_aside": set_aside_of(store)}


def _render_status(r: dict) -> None:
    out = result_console()
    p = r["pending_requests"]
    out.print(
        f"{r['store']}: {r['n']} rows ({r['n_alive']} alive); pending deletion requests: "
        f"{p['count']}" + (f" (oldest {p['oldest_age_seconds']:.0f} s)" if p["count"] else ""),
    )
    if p["unrecognised"]:
        out.print(f"{p['unrecognised']} objects in the queue are not deletion requests (the next "
                  "drain sets them aside)")  # fmt: skip
    _render_set_aside(r["set_aside"])
    if p["abandoned"]:
        out.print(f"{p['abandoned']} temporary request files of producers killed before filing "
                  "(never applied; the next drain deletes them)")  # fmt: skip
    out.print(f"last commit {r['last_commit']['id']} at {r['last_commit']['time']}: "
              f"{r['last_commit']['message']}")  # fmt: skip
    for name, a in r["artifacts"].items():
        out.print(f"{name}: {'present' if a['exists'] else 'absent'}"
                  + (f", current: {a['current']}" if a["exists"] else ""))  # fmt: skip
    out.print(f"erasure retention: {r['erasure_retention']} ({r['not_yet_erased']} applied "
              f"requests still in earlier snapshots)")  # fmt: skip
    lay = r["layout"]
    missing = [what for what, have in (("exact keys", lay["keys"] == "exact"),
                                       ("point sketch", lay["sketch"]),
                                       ("sketch residual", lay["sketch_residual"])) if not have]  # fmt: skip
    out.print(f"layout: format {lay['format']}, {lay['keys']} keys"
              + (f"; without {', '.join(missing)} (re-ingest into a new store to get them)"
                 if missing else ""))  # fmt: skip


@command(render=_render_status, read_only=True)
def status(store: Store, *, shared: Shared) -> dict:
    """A store's rows, pending deletion requests, last commit and artifacts.

    \b
    Example (a store made by 'fairpipe ingest digits --store digits.store'):
      fairpipe status --store digits.store
    """
    from fairpipe.flows.status import store_status

    return store_status(store)


CONFIGURE_NOTHING = "Give --erasure-retention, --max-radius or both."


def _render_configure(r: dict) -> None:
    out = result_console()
    if r["erasure_retention"] is not None:
        out.print(f"erasure_retention: {r['before']} -> {r['erasure_retention']} "
                  f"(commit {r['commit']})")  # fmt: skip
    if r["radius_range"] is not None:
        g = r["radius_range"]
        if not g["added"]:
            out.print(
                f"radius range: up to {g['before']:.4g} already reaches {g['max_radius']:.4g}"
            )
            return
        added = ", ".join(f"{s[0]:.4g} ({s[2]} tables)" for s in g["added"])
        out.print(f"radius range: up to {g['before']:.4g} -> up to {g['max_radius']:.4g}; "
                  f"scales added: {added}; {g['n_tables']} tables (commit {g['commit']})")  # fmt: skip


def _check_configure(**o) -> None:
    from fairpipe.storage.erasure import parse_retention

    if o["erasure_retention"] is None and o["max_radius"] is None:
        raise FairpipeInputError(CONFIGURE_NOTHING)
    if o["erasure_retention"] is not None:
        parse_retention(o["erasure_retention"])


@command(shared=("lock_timeout", "as_json"), render=_render_configure, check=_check_configure,
         settings=(ERASURE_RETENTION, EXTEND_RADIUS))  # fmt: skip
def configure(store: Store, *, shared: Shared, erasure_retention: str | None,
              max_radius: float | None) -> dict:  # fmt: skip
    """Change a store's settings: erasure_retention; the radius range of its index.

    \b
    Examples (a store made by 'fairpipe ingest digits --store digits.store'):
      fairpipe configure --store digits.store --erasure-retention 7d
      fairpipe configure --store digits.store --max-radius 40
    """
    from fairpipe.storage.erasure import set_retention
    from fairpipe.storage.scales import add_scales
    from fairpipe.storage.store import FairpipeStore

    opened = FairpipeStore.open(store)
    out: dict = {"store": opened.url, "erasure_retention": None, "radius_range": None}
    if max_radius is not None:  # (its own keys: the retention's are the result's own)
        out["radius_range"] = add_scales(opened, max_radius, shared.lock_timeout)
    if erasure_retention is not None:
        out.update(set_retention(opened, erasure_retention, shared.lock_timeout))
    return out
