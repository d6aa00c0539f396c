"""The demo end to end: ingest, fair sampling, fit, summarize, forget (what `make demo` runs)."""

from fairpipe.flows.demo import run_demo
from fairpipe.storage.arrays import read_array
from fairpipe.storage.store import FairpipeStore


def test_demo_forgets_people_who_were_being_sampled(prefect_server, tmp_path):
    r = run_demo(store=str(tmp_path / "demo"), n_queries=8, plot=str(tmp_path / "tv.png"))
    assert (tmp_path / "tv.png").stat().st_size > 0
    ev = r["evaluation"]["methods"]
    assert ev["exact"]["ratio_to_floor"] < 2 < ev["uniform"]["ratio_to_floor"]
    # On the true ball: the share of it the index finds, and TV on it at least what is missed.
    truth = r["evaluation"]
    assert 0 < truth["min_coverage"] <= truth["mean_coverage"] <= 1
    assert ev["exact"]["tv_ball"] >= 1 - truth["mean_coverage"]
    assert r["fit"]["leaves"] == 64 and len(r["forget"]["deleted"]) == 22
    assert r["summary"]["error"] == 0 and len(r["summary"]["ids"]) <= 20
    assert all(1 <= c <= 4 for c in r["summary"]["counts"].values())
    # The forgotten summary members were replaced; the summary still meets every bound.
    stored = read_array(FairpipeStore.open(r["store"]).readonly_session(), "summary/ids")
    assert len(r["summary_members_forgotten"]) == 2
    assert not set(r["summary_members_forgotten"]) & set(stored.tolist())
    assert r["forget"]["summary_error"] == 0
    # The forgotten ids were drawn before the forget, and never after.
    assert r["forgotten_in_samples"]["before"] > 0
    assert r["forgotten_in_samples"]["after"] == 0
    # The production story: two requests, one drain, receipts, and the rows gone everywhere.
    assert len(r["receipts"]) == 2 and all(x["erased_at"] for x in r["receipts"])
    proof = r["erasure_proof"]
    assert proof["rows"] == 22 and proof["rows_in_snapshots"] == 0
    assert proof["files_holding_erased_bytes"] == 0 and proof["files_scanned"] > 20
