"""A store written with the older attribute names (``lsh`` -> ``k``, ``width``; ``tree`` ->
``width``, ``iterations``; ``summary`` -> ``width``) is read as if it held the library's names,
and its next commit (a forget) rewrites them (fairpipe.storage.names)."""

import numpy as np
import pytest

from fairpipe.flows.fit import run_fit
from fairpipe.flows.forget import run_forget
from fairpipe.flows.ingest import run_ingest
from fairpipe.flows.options import FitOptions, IngestOptions, SummarizeOptions
from fairpipe.flows.summarize import run_summarize
from fairpipe.old_names import OLD_ATTRIBUTES
from fairpipe.storage.arrays import open_group
from fairpipe.storage.models import model_params
from fairpipe.storage.reader import open_reader
from fairpipe.storage.store import FairpipeStore
from fairpipe.storage.summary import summary_tree

THREADS = dict(n_workers=1, processes=False)
OLD = {place: {new: old for old, new in names.items()} for place, names in OLD_ATTRIBUTES.items()}


def _raw(path) -> tuple[dict, dict, dict]:
    """The root's ``lsh``, the tree's and the summary's attributes as stored."""
    root = open_group(FairpipeStore.open(str(path)).readonly_session())
    return dict(root.attrs["lsh"]), dict(root["tree"].attrs), dict(root["summary"].attrs)


def _write_old_names(path) -> None:
    """Rewrite the attributes under the older names, as a store written before them holds
    them (one commit, without the transaction that would upgrade them)."""
    store = FairpipeStore.open(str(path))
    session = store.repo.writable_session("main")
    root = open_group(session, mode="a")
    root.attrs["lsh"] = {OLD["lsh"].get(k, k): v for k, v in root.attrs["lsh"].items()}
    for place in ("tree", "summary"):
        old = {OLD[place].get(k, k): v for k, v in root[place].attrs.items()}
        root[place].attrs.put(old)
    session.commit("attributes under their older names")


@pytest.fixture(scope="module")
def old_store(prefect_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("old-names")
    rng = np.random.default_rng(0)
    np.save(tmp / "x.npy", rng.normal(size=(300, 4)).astype(np.float32))
    np.save(tmp / "g.npy", rng.integers(0, 2, 300))
    path = tmp / "s"
    run_ingest(str(tmp / "x.npy"), str(path), IngestOptions(seed=1, n_hashes=3, n_tables=4,
               bucket_width=2.0, groups_file=str(tmp / "g.npy")), **THREADS)  # fmt: skip
    run_fit(str(path), FitOptions(n_clusters=3, fanout=2, height=1, max_iter=4, n_init=1),
            **THREADS)  # fmt: skip
    run_summarize(str(path), SummarizeOptions(k=6, lower=0.2, upper=0.8, fanout=2, height=1,
                  eval_size=64), **THREADS)  # fmt: skip
    _write_old_names(path)
    return path


def test_a_store_with_the_older_names_is_read_then_upgraded_by_its_next_commit(old_store):
    lsh, tree, summary = _raw(old_store)
    assert {"k", "width"} <= set(lsh) and not {"n_hashes", "bucket_width"} & set(lsh)
    assert {"width", "iterations"} <= set(tree) and "fanout" not in tree
    assert "width" in summary and "fanout" not in summary
    store = FairpipeStore.open(str(old_store))
    attrs = store.attrs()
    assert (attrs["lsh"]["n_hashes"], attrs["lsh"]["bucket_width"]) == (3, 2.0)
    session = store.readonly_session()
    params = model_params(session, "dc")
    assert (params["fanout"], params["max_iter"], params["n_clusters"]) == (2, 4, 3)
    assert summary_tree(session)[1:3] == (2, 1)  # fan-out and height
    reader = open_reader(str(old_store))
    assert reader.attrs["lsh"]["n_hashes"] == 3
    assert len(reader.sample(query_rows=[0], radius=3.0, n_samples=5, seed=0).ids[0]) == 5
    # The next write (a forget updates the index, the tree and the summary) upgrades them all.
    run_forget(str(old_store), [7], **THREADS)
    lsh, tree, summary = _raw(old_store)
    assert (lsh["n_hashes"], lsh["bucket_width"]) == (3, 2.0) and not {"k", "width"} & set(lsh)
    assert (tree["fanout"], tree["max_iter"]) == (2, 4)
    assert not {"width", "iterations"} & set(tree)
    assert summary["fanout"] == 2 and "width" not in summary
