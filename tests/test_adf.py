"""ADF search: gradients, every sample re-checked independently, determinism, ADF vs random."""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression
from sklearn.neural_network import MLPClassifier

from fairpipe.adf import adf_search, cluster_seeds
from fairpipe.audit_data import PROTECTED, load_audit_data
from fairpipe.discrimination import (
    Domain,
    check_discrimination,
    discrimination_rate,
    random_search,
)
from fairpipe.errors import FairpipeInputError
from fairpipe.model_adapters import FiniteDifferenceAdapter, MLPAdapter, adapter_for

NAMES = ["sex", "a", "b", "c", "d", "e"]


def fit(X, y, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return MLPClassifier(random_state=0, max_iter=300, **kw).fit(X, y)


@pytest.fixture(scope="module")
def biased():
    """Integer data whose label leans on the protected attribute, and a model trained on it."""
    rng = np.random.default_rng(0)
    X = rng.integers(0, 10, size=(3000, 6))
    X[:, 0] = rng.integers(0, 2, size=3000)
    y = (X[:, 1] + X[:, 2] + 4 * X[:, 0] + rng.normal(0, 1, 3000) > 11).astype(int)
    model = fit(X.astype(float), y, hidden_layer_sizes=(16, 8))
    domain = Domain.make(NAMES, [0] * 6, [1] + [9] * 5, ["sex"])
    return X, model, domain


@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic"])
@pytest.mark.parametrize("n_classes", [2, 3])
def test_analytic_gradients_equal_finite_differences(activation, n_classes):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 4))
    y = np.digitize(X[:, 0] + X[:, 1], [-0.5, 0.5][: n_classes - 1])
    model = fit(X, y, hidden_layer_sizes=(7, 5), activation=activation)
    a, fd = MLPAdapter(model), FiniteDifferenceAdapter(model, eps=1e-5)
    assert np.allclose(a.predict_proba(X), model.predict_proba(X))
    assert np.array_equal(a.predict(X), np.searchsorted(model.classes_, model.predict(X)))
    assert np.allclose(a.gradient(X[:20]), fd.gradient(X[:20]), atol=1e-6)


def independent_check(model, X, domain) -> np.ndarray:
    """Discriminatory or not, one row at a time, with the model's own predict."""
    out = []
    for x in X:
        preds = set()
        for v in range(domain.lower[0], domain.upper[0] + 1):
            x2 = x.copy()
            x2[0] = v
            preds.add(int(model.predict(x2[None].astype(float))[0]))
        out.append(len(preds) > 1)
    return np.array(out)


def test_every_sample_is_discriminatory_and_adf_beats_random(biased):
    X, model, domain = biased
    adapter = adapter_for(model, n_features=6)
    seeds = cluster_seeds(X, 40, seed=0)
    res = adf_search(adapter, seeds, domain, n_local=60, seed=3)
    assert res.discriminatory.shape[0] > 20
    assert independent_check(model, res.discriminatory, domain).all()
    assert ((res.discriminatory >= domain.lower) & (res.discriminatory <= domain.upper)).all()
    assert len({r.tobytes() for r in res.discriminatory}) == res.discriminatory.shape[0]
    rnd = random_search(adapter, domain, budget=res.generated, seed=3)
    assert rnd.generated <= res.generated
    assert res.discriminatory.shape[0] > 2 * rnd.discriminatory.shape[0]
    assert res.success_rate > rnd.success_rate
    # Same seed, same samples.
    again = adf_search(adapter, seeds, domain, n_local=60, seed=3)
    assert np.array_equal(again.discriminatory, res.discriminatory)
    rate = discrimination_rate(adapter, domain, n=2000)
    assert 0 < rate < 1
    assert np.isclose(
        rate,
        independent_check(model, domain.uniform(np.random.default_rng(0), 2000), domain).mean(),
    )


def test_check_discrimination_finds_the_most_different_counterpart(biased):
    X, model, domain = biased
    adapter = MLPAdapter(model)
    disc, counterpart = check_discrimination(adapter, X[:200], domain)
    assert np.array_equal(disc, independent_check(model, X[:200], domain))
    assert (counterpart[:, 1:] == X[:200, 1:]).all()  # only the protected attribute differs
    assert (counterpart[:, 0] != X[:200, 0]).all()  # two values: the other one is the farthest
    # A row whose protected value lies outside the domain is compared with every domain value.
    odd = X[:20].copy()
    odd[:, 0] = 3
    disc, _ = check_discrimination(adapter, odd, domain)
    own = model.predict(odd.astype(float))
    others = np.stack(
        [model.predict(np.c_[np.full(20, v), odd[:, 1:]].astype(float)) for v in (0, 1)]
    )
    assert np.array_equal(disc, (others != own).any(axis=0))


def test_bad_input_is_named(biased):
    X, model, domain = biased
    with pytest.raises(FairpipeInputError, match="Protected attribute 'race' is not in the data"):
        Domain.make(NAMES, [0] * 6, [9] * 6, ["race"])
    with pytest.raises(FairpipeInputError, match="Attribute 'a' has lower bound 5 above"):
        Domain.make(NAMES, [0, 5, 0, 0, 0, 0], [1, 4, 9, 9, 9, 9], ["sex"])
    with pytest.raises(FairpipeInputError, match="has no predict_proba"):
        adapter_for(LinearRegression().fit(X[:50], X[:50, 1]))
    with pytest.raises(
        FairpipeInputError, match="The model expects 6 input columns; the data has 5"
    ):
        adapter_for(model, n_features=5)
    with pytest.raises(FairpipeInputError, match="'n_local' parameter of adf_search"):
        adf_search(MLPAdapter(model), X[:5], domain, n_local=0)
    with pytest.raises(FairpipeInputError, match="'budget' parameter of random_search"):
        random_search(MLPAdapter(model), domain, budget=-1)


@pytest.mark.data
@pytest.mark.parametrize(
    "name, n, d", [("adult", 30162, 13), ("german", 1000, 20), ("bank", 40004, 16)]
)
def test_real_data_sets_are_encoded_within_their_own_domains(name, n, d):
    from conftest import SHARED_DATA

    data = load_audit_data(name, SHARED_DATA)
    assert data.X.shape == (n, d) and set(np.unique(data.y)) == {0, 1}
    assert ((data.X >= data.lower) & (data.X <= data.upper)).all()
    for attr in PROTECTED[name]:
        data.domain([attr])  # every protected attribute of the paper is there


def test_integer_csv_loader_names_bad_rows(tmp_path):
    good = tmp_path / "good.csv"
    good.write_text("sex,a,label\n0,3,1\n1,5,0\n1,4,1\n")
    data = load_audit_data(str(good))
    assert data.domain_names == ("sex", "a") and data.upper.tolist() == [1, 5]
    (tmp_path / "gap.csv").write_text("sex,a,label\n0,3,1\n1,,0\n")
    with pytest.raises(FairpipeInputError, match="Row 1 of .*gap.csv has no value in column 'a'"):
        load_audit_data(str(tmp_path / "gap.csv"))
    (tmp_path / "text.csv").write_text("sex,a,label\n0,3,1\n1,x,0\n")
    with pytest.raises(FairpipeInputError, match="Row 1 of .*text.csv has 'x' in column 'a'"):
        load_audit_data(str(tmp_path / "text.csv"))
    (tmp_path / "nolabel.csv").write_text("sex,a\n0,3\n")
    with pytest.raises(FairpipeInputError, match="has no column 'label'"):
        load_audit_data(str(tmp_path / "nolabel.csv"))
    with pytest.raises(FairpipeInputError, match="does not exist"):
        load_audit_data(str(tmp_path / "missing.csv"))
