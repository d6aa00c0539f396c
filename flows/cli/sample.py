"""``fairpipe sample``: uniformly random near neighbours of a query, from the committed index."""

from __future__ import annotations

from typing import Any

from fairpipe.errors import FairpipeInputError
from fairpipe.flows.cli._options import Store, given_queries
from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import Shared, command
from fairpipe.settings import QUERIES, SAMPLE

INCLUDE_QUERY_FILE = (
    "--include-query applies to --query-id, --query-ids-file and --query-row: the points of "
    "--query-file are given by value, not rows of the store. Leave out --include-query."
)
SMALL = "query {i}: its neighbourhood within r={radius:.4g} {holds}{without}; {hint}"
HINT = "try --radius {suggested:.4g} (about {holding} of the {candidates:,} candidates it read)"
ALL_HINT = "try --radius {suggested:.4g} (all {candidates:,} candidates it read)"
NO_HINT = (
    "its LSH buckets hold no{other} point, so no radius helps here; a store ingested with a "
    "larger --radius has fuller buckets"
)
RECALL = (
    "expected recall {recall:.3f} at r={radius:.4g}: a point within r is among the points the "
    "samples come from, M(q), with probability at least {recall:.3f}"
)


OUT_OF_RANGE = (
    "r={radius:.4g} is outside the store's radius range (its recall target holds up to "
    "{top:.4g}): expected recall {recall:.3f}, so up to {missed:.0%} of the people within r are "
    "never drawn; extend the range with: {extend}"
)
EXTEND = "fairpipe configure --store {store} --max-radius {radius}"

SHORT = {
    "empty": "query {i}: 0 of {asked:,} samples drawn: its neighbourhood M(q) is empty",
    "draw_limit": (
        "query {i}: {drawn:,} of {asked:,} samples drawn: its draws reached their limit "
        "({draws:,} draws, the {sampler} sampler accepting about 1 in {rate:,.0f})"
    ),
}


def short_line(i: int, q: dict, sampler: str) -> str | None:
    """The line saying why query ``i`` got fewer samples than asked (None if it got all)."""
    if q.get("why") is None:
        return None
    rate = q["draws"] / max(q["drawn"], 1)
    return SHORT[q["why"]].format(i=i, asked=q["asked"], drawn=q["drawn"], draws=q["draws"],
                                  sampler=sampler, rate=rate)  # fmt: skip


def _render(r: dict) -> None:
    out = result_console()
    if r["in_range"] is False:
        out.print(OUT_OF_RANGE.format(radius=r["radius"], top=r["max_radius"],
                                      recall=r["expected_recall"],
                                      missed=1 - r["expected_recall"], extend=r["extend_range"]))  # fmt: skip
    out.print(RECALL.format(recall=r["expected_recall"], radius=r["radius"]))
    for i, q in enumerate(r["queries"]):
        out.print(
            f"query {i}: |M(q)| = {q['neighbourhood_size']} within r={r['radius']:.4g} "
            f"({r['mode']} mode, {r['sampler']} sampler)",
        )
        print(" ".join(map(str, q["ids"])))
        line = short_line(i, q, r["sampler"])
        if line is not None:
            out.print(line)
        line = small_line(i, q, r["radius"], r["own_row_excluded"])
        if line is not None:
            out.print(line)


def small_line(i: int, q: dict, radius: float, excluded: bool) -> str | None:
    """The line saying that query ``i``'s neighbourhood (without its own row: ``excluded``) is
    empty or holds one point, with the radius suggested (None for a larger neighbourhood)."""
    size = q["neighbourhood_size"]
    if size > 1 or "candidates" not in q:
        return None
    from fairpipe.storage.reader import SUGGEST_HOLDING

    holds = "is empty" if size == 0 else "holds one point"
    without = " besides the query itself" if excluded else ""
    suggested, candidates = q.get("suggested_radius"), q["candidates"]
    if suggested is None:
        hint = NO_HINT.format(other=" other" if excluded else "")
    elif candidates < SUGGEST_HOLDING:
        hint = ALL_HINT.format(suggested=suggested, candidates=candidates)
    else:
        hint = HINT.format(suggested=suggested, holding=SUGGEST_HOLDING, candidates=candidates)
    return SMALL.format(i=i, radius=radius, holds=holds, without=without, hint=hint)


@command(render=_render, read_only=True, settings=(*QUERIES, *SAMPLE))
def sample(store: Store, *, shared: Shared, **settings: Any) -> dict:
    """Draw uniformly random near neighbours of a query (N_SAMPLES of them).

    Give one of --query-id, --query-ids-file (many queries), --query-row or --query-file.

    \b
    Examples (a store made by 'fairpipe ingest digits --store digits.store'):
      fairpipe sample --store digits.store --query-id 42
      fairpipe sample --store digits.store --query-row 7 --n-samples 5 --sampler rank --json
    """
    from fairpipe.flows.sample import sample_store

    queries = given_queries(settings)
    if settings["include_query"] and queries["queries"] is not None:
        raise FairpipeInputError(INCLUDE_QUERY_FILE)
    result = sample_store(store, **queries, **settings)
    result["extend_range"] = None
    if result["in_range"] is False:
        result["extend_range"] = EXTEND.format(store=store, radius=f"{result['radius']:.6g}")
    return result
