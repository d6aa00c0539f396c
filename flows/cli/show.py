"""``fairpipe show``: stored rows by id (group and features), and when a forgotten one was
forgotten, with its receipt."""

from __future__ import annotations

from fairpipe.errors import FairpipeInputError
from flows.cli._options import Ids, IdsFile, Store
from flows.cli._runner import Shared, command, result_console

ONE_SOURCE = "Give exactly one of --ids or --ids-file."
# Features shown in the table; --json has them all.
SHOWN_FEATURES = 8


def _render(r: dict) -> None:
    from rich.table import Table

    out = result_console()
    d = int(r["d"])
    shown = min(d, SHOWN_FEATURES)
    table = Table("id", "group", *(f"x{j}" for j in range(shown)), title=None)
    forgotten = []
    for row in r["rows"]:
        if row["forgotten"]:
            forgotten.append(row)
            continue
        table.add_row(str(row["id"]), row["group"], *(f"{v:.4g}" for v in row["features"][:shown]))
    if len(forgotten) < len(r["rows"]):
        out.print(table)
        if d > shown:
            out.print(f"(the first {shown} of {d} features; --json has all)")
    for row in forgotten:
        receipt = row["receipt"]
        if receipt is None:
            out.print(f"id {row['id']}: forgotten (the store records no receipt for its row)")
            continue
        line = (
            f"id {row['id']}: forgotten at {receipt['applied_at']} by request "
            f"{receipt['request']} (filed {receipt['requested_at']}, {receipt['n_ids']} ids; "
            f"commit {receipt['commit']}"
        )
        line += f"; erased from history at {receipt['erased_at']}" if receipt["erased_at"] else (
            "; earlier snapshots still hold it")  # fmt: skip
        if receipt["reason"]:
            line += f"; reason: {receipt['reason']}"
        out.print(line + ")")


def _check(**o) -> None:
    from flows.cli._options import check_ids_given

    check_ids_given(o["ids"], o["ids_file"], ONE_SOURCE, required=True)


@command(render=_render, read_only=True, check=_check)
def show(store: Store, ids: Ids = None, ids_file: IdsFile = None, *, shared: Shared) -> dict:
    """Show stored rows by id: group and features, or when a forgotten id was forgotten and its
    receipt."""
    from fairpipe.datasets import read_ids
    from flows.show import show_rows

    if (ids is None) == (ids_file is None):
        raise FairpipeInputError(ONE_SOURCE)
    return show_rows(store, read_ids(text=ids, path=ids_file))
