"""``fairpipe show``: stored rows by id (group and features), and when a forgotten one was
forgotten, with its receipt."""

from __future__ import annotations

from fairpipe.flows.cli._options import Store, check_ids_given
from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import Shared, command
from fairpipe.settings import GIVEN_IDS


def _render(r: dict) -> None:
    from rich.table import Table

    out = result_console()
    live = [row for row in r["rows"] if not row["forgotten"]]
    if live:
        # As many features as the console's width holds beside the whole id and group (a
        # column costs its text and 3 characters of border and padding); --json has them all.
        cells = [[f"{v:.4g}" for v in row["features"]] for row in live]
        ids = [str(row["id"]) for row in live]
        groups = [row["group"] for row in live]
        used = 1 + max(map(len, ids + ["id"])) + 3 + max(map(len, groups + ["group"])) + 3
        names = r["feature_names"]
        shown = 0
        for j in range(int(r["d"])):
            width = max(len(names[j]), *(len(c[j]) for c in cells)) + 3
            if shown and used + width > out.width:
                break
            used, shown = used + width, shown + 1
        table = Table("id", "group", *names[:shown])
        for column in table.columns:
            column.no_wrap = True
        for i, g, c in zip(ids, groups, cells):
            table.add_row(i, g, *c[:shown])
        out.print(table)
        if shown < int(r["d"]):
            out.print(f"(the first {shown} of {r['d']} features; --json has all)")
        if r["scale"] != "none":
            out.print(f"(in the source's units; the store keeps them scaled: {r['scale']})")
    for row in r["rows"]:
        if not row["forgotten"]:
            continue
        receipt = row["receipt"]
        if receipt is None:
            out.print(f"id {row['id']}: forgotten (the store records no receipt for its row)")
            continue
        line = (
            f"id {row['id']}: forgotten at {receipt['applied_at']} by request "
            f"{receipt['request']} (filed {receipt['requested_at']}, {receipt['n_ids']} ids; "
            f"commit {receipt['commit']}"
        )
        if receipt["erased_at"]:
            line += f"; erased from history at {receipt['erased_at']}"
        else:
            line += "; earlier snapshots still hold it"
        if receipt["reason"]:
            line += f"; reason: {receipt['reason']}"
        out.print(line + ")")


def _check(**o) -> None:
    check_ids_given(o["ids"], o["ids_file"])


@command(render=_render, read_only=True, check=_check, settings=GIVEN_IDS)
def show(store: Store, *, shared: Shared, ids: str | None, ids_file: str | None) -> dict:
    """Show stored rows by id (group, features); for a forgotten id, when and its receipt.

    \b
    Example (a store made by 'fairpipe ingest digits --store digits.store'):
      fairpipe show --store digits.store --ids 0,1,2
    """
    from fairpipe.datasets import read_ids
    from fairpipe.flows.show import show_rows

    return show_rows(store, read_ids(text=ids, path=ids_file))
