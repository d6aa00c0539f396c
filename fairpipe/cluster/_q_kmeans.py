"""Q-k-means: quantised Lloyd's whose deletions are usually certified without retraining.

Ginart, Guan, Valiant, Zou, "Making AI Forget You" (NeurIPS 2019), Section 4.1, with the authors'
code's defects fixed (exact mean update, assignments against the quantised centroids that were
actually used, metadata indexed per iteration, k-means++ seeds protected).

Training: greedy k-means++ seeds, then up to ``max_iter`` Lloyd steps. Step t assigns every point
to the nearest of the centroids ``c_in[t]`` it starts from, takes each cluster's mean, pulls a
cluster of size m below ``balance * n / k`` toward its previous centroid
(``c <- (m / (balance n / k)) c + (1 - m / (balance n / k)) c_prev``) and quantises the result to an
epsilon-lattice with a random phase theta ~ U[0, 1)^d:
``Q(c) = eps * (round(c / eps + theta - 1/2) - (theta - 1/2))``. Training stops early when the
assignment loss increases. Every step's sums, sizes, phases, inputs, outputs and loss are kept.

Restarts (``n_init``): whole training runs from different seeds; the run whose final centroids
have the lowest loss is the model. A deletion is certified only if it is certified in every run
and the same run stays the best (its loss, like every run's, drops by x's distance to its final
centroids), so the model is still the one retraining would choose.

Deletion of a point x: if x was a k-means++ seed (of any run), retrain. Otherwise replay every step with x
removed: its cluster under ``c_in[t]`` loses x (sum - x, size - 1: the exact new mean), n becomes
n - 1 (which moves the balance threshold of every cluster), and the quantised outputs must all stay
the same, as must every early-stop decision; then the deletion is *certified*: only the metadata
changes, and the model is the one retraining from the same seeds would give. Otherwise, retrain on
the remaining points (same seed). Certification falls with dimension (the lattice cells shrink
relative to the mean's movement): prefer DC-k-means in high dimension (see :func:`choose_model`).

>>> X = np.random.default_rng(0).normal(size=(500, 3))
>>> model = QKMeans(n_clusters=3, epsilon=0.5, seed=1).fit(X)
>>> report = model.delete([10, 11])
>>> report.deleted.tolist(), report.certified + int(report.retrained) > 0
([10, 11], True)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fairpipe.base import DeletionReport, rows_from_arrays
from fairpipe.cluster._batched_kmeans import (
    KMeansParameters,
    cluster_sums,
    kmeans_plus_plus,
    nearest,
)
from fairpipe.errors import (
    K_TOO_LARGE,
    FairpipeInputError,
    check_positive_int,
)
from fairpipe.settings import BALANCE, EPSILON, Q_KMEANS, Q_N_INIT
from fairpipe.validation import check_estimator_points, check_points_and_ids

# Arrays of a fitted model's state (per run, padded to the longest run; see QKMeans.to_arrays).
Q_STATE = (
    "c_in", "c_out", "thetas", "sums", "sizes", "losses", "steps", "stop_losses", "final_losses",
    "seed_ids",
)  # fmt: skip
MISSING_STATE = "QKMeans.from_arrays: the array {name!r} is missing."


def quantise(c: np.ndarray, theta: np.ndarray, eps: float) -> np.ndarray:
    """The lattice point eps * (Z^d - (theta - 1/2)) nearest to c."""
    shift = theta - 0.5
    return eps * (np.round(c / eps + shift) - shift)


@dataclass
class _Run:
    """One training run's metadata: step t went from ``c_in[t]`` to ``c_out[t]``."""

    c_in: np.ndarray  # (T, k, d)
    c_out: np.ndarray  # (T, k, d)
    thetas: np.ndarray  # (T, k, d) lattice phases
    sums: np.ndarray  # (T, k, d) cluster sums under c_in[t]
    sizes: np.ndarray  # (T, k)
    losses: np.ndarray  # (T,) loss of c_in[t]
    stop_loss: float | None  # loss of c_out[-1] when it rose and stopped training
    final_loss: float  # loss of c_out[-1] (the run's centroids)
    seed_ids: np.ndarray  # ids of its k-means++ seeds


@dataclass(kw_only=True, repr=False, eq=False)
class QKMeans(KMeansParameters):
    """Quantised k-means with certified deletion.

    Parameters
    ----------
    n_clusters : int
    epsilon : float
        Lattice spacing of the quantisation, in the data's units. Larger: more deletions certified
        (fewer retrains), and a higher loss (quantisation adds about d * eps^2 / 12 per point).
    balance : float in (0, 1)
        Clusters smaller than ``balance * n / k`` are pulled toward their previous centroid (the
        paper's gamma).
    max_iter : int
        Most Lloyd steps.
    n_init : int
        Training runs from different seeds; the lowest final loss wins.
    seed : int
    """

    _fitted_attribute = "centroids_"
    _settings = Q_KMEANS

    epsilon: float = EPSILON.default
    balance: float = BALANCE.default
    n_init: int = Q_N_INIT.default

    def _check_params(self) -> None:
        self._check_kmeans_params()

    def fit(self, X: np.ndarray, y=None, *, ids: np.ndarray | None = None) -> QKMeans:
        """Train on the rows of ``X`` (``ids``: one per row, default the row numbers; ``y`` is
        ignored, as by scikit-learn's clustering estimators)."""
        self._check_params()
        X, ids = check_points_and_ids(X, ids, "QKMeans")
        self._set_rows(X, ids)
        self.n_features_in_ = X.shape[1]
        self.n_retrains_ = 0
        self._train()
        return self

    def _train(self) -> None:
        rows = np.flatnonzero(self.alive_)
        # Canonical order: by id, so the model does not depend on row order.
        rows = rows[np.argsort(self.ids_[rows], kind="stable")]
        X = self.points_[rows].astype(np.float64)
        k = int(self.n_clusters)
        if k > X.shape[0]:
            raise FairpipeInputError(
                K_TOO_LARGE.format(name="n_clusters", k=k, n=X.shape[0],
                                   what="points given to QKMeans.fit")
            )  # fmt: skip
        self.runs_ = [self._train_run(X, self.ids_[rows], r) for r in range(int(self.n_init))]
        self.n_fit_ = X.shape[0]
        self._choose()

    def _train_run(self, X: np.ndarray, ids: np.ndarray, r: int) -> _Run:
        n, d = X.shape
        k = int(self.n_clusters)
        eps, T = float(self.epsilon), int(self.max_iter)
        c, seed_pos = kmeans_plus_plus(X, k, key=0x51 + (r << 8), seed=int(self.seed))
        seed_ids = np.unique(ids[seed_pos[seed_pos >= 0]])
        entropy = [int(self.seed), 0x514B] + ([r] if r else [])
        thetas = np.random.default_rng(np.random.SeedSequence(entropy)).random((T, k, d))
        c_in: list[np.ndarray] = []
        c_out: list[np.ndarray] = []
        sums: list[np.ndarray] = []
        sizes: list[np.ndarray] = []
        losses: list[float] = []
        stop_loss: float | None = None
        for t in range(T):
            label, dist = nearest(X, c)
            loss = float(dist.sum())
            if losses and loss > losses[-1]:
                stop_loss = loss  # the loss increased: keep the previous step's centroids
                break
            s, m = cluster_sums(X, label, k)
            q = quantise(_balanced(s, m, c, self.balance * n / k), thetas[t], eps)
            c_in.append(c)
            c_out.append(q)
            sums.append(s)
            sizes.append(m)
            losses.append(loss)
            c = q
        final = stop_loss if stop_loss is not None else float(nearest(X, c)[1].sum())
        return _Run(
            np.array(c_in), np.array(c_out), thetas[: len(c_out)], np.array(sums),
            np.array(sizes), np.array(losses), stop_loss, final, seed_ids,
        )  # fmt: skip

    def _choose(self, seed_ids: np.ndarray | None = None) -> None:
        finals = [run.final_loss for run in self.runs_]
        self.best_ = int(np.argmin(finals))  # ties: the lowest run
        if seed_ids is None:
            seed_ids = np.unique(np.concatenate([run.seed_ids for run in self.runs_]))
        self.seed_ids_ = np.asarray(seed_ids, dtype=np.int64)
        self.centroids_ = self.runs_[self.best_].c_out[-1]

    # The best run's metadata, under the names a single run would have.
    c_in_ = property(lambda self: self.runs_[self.best_].c_in)
    c_out_ = property(lambda self: self.runs_[self.best_].c_out)
    thetas_ = property(lambda self: self.runs_[self.best_].thetas)
    sums_ = property(lambda self: self.runs_[self.best_].sums)
    sizes_ = property(lambda self: self.runs_[self.best_].sizes)
    losses_ = property(lambda self: self.runs_[self.best_].losses)
    stop_loss_ = property(lambda self: self.runs_[self.best_].stop_loss)

    @property
    def n_iter_(self) -> int:
        """The Lloyd steps the model's run kept (scikit-learn's name)."""
        self._check_fitted()
        return int(self.runs_[self.best_].c_out.shape[0])

    def to_arrays(self, data: bool = True) -> dict[str, np.ndarray]:
        """Every run's metadata (a leading run axis, padded with zeros to the longest run;
        ``steps`` per run), the k-means++ seed ids, and with ``data`` the rows (``points``,
        ``ids``, ``alive``)."""
        self._check_fitted()
        R = len(self.runs_)
        T = max(run.c_out.shape[0] for run in self.runs_)
        arrays: dict[str, np.ndarray] = {}
        for name in ("c_in", "c_out", "thetas", "sums", "sizes", "losses"):
            first = getattr(self.runs_[0], name)
            out = np.zeros((R, T) + first.shape[1:])
            for r, run in enumerate(self.runs_):
                value = getattr(run, name)
                out[r, : value.shape[0]] = value
            arrays[name] = out
        arrays["steps"] = np.array([run.c_out.shape[0] for run in self.runs_], dtype=np.int64)
        arrays["stop_losses"] = np.array(
            [np.nan if run.stop_loss is None else run.stop_loss for run in self.runs_]
        )
        arrays["final_losses"] = np.array([run.final_loss for run in self.runs_])
        arrays["seed_ids"] = self.seed_ids_
        return {**arrays, **self._row_arrays(data)}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], **params) -> QKMeans:
        """A fitted model from :meth:`to_arrays` output and the constructor parameters. The
        model's run is the one with the lowest final loss, as after training; the size the
        balance threshold uses is the number of live rows given (``alive``), or of the points
        the run assigned when no rows are given."""
        model = cls(**params)
        model._check_params()
        for name in Q_STATE:
            if name not in arrays:
                raise FairpipeInputError(MISSING_STATE.format(name=name))
        a = {name: np.asarray(arrays[name]) for name in Q_STATE}
        model.runs_ = []
        for r, T in enumerate(a["steps"].tolist()):
            stop = float(a["stop_losses"][r])
            model.runs_.append(_Run(
                a["c_in"][r, :T], a["c_out"][r, :T], a["thetas"][r, :T], a["sums"][r, :T].copy(),
                a["sizes"][r, :T].copy(), a["losses"][r, :T].copy(),
                None if np.isnan(stop) else stop, float(a["final_losses"][r]), np.zeros(0),
            ))  # fmt: skip
        model._choose(seed_ids=a["seed_ids"])
        model.n_features_in_ = int(model.centroids_.shape[1])
        model.n_retrains_ = 0
        rows = rows_from_arrays(arrays)
        if rows is not None:
            model._set_rows(rows["points"], rows["ids"], rows.get("alive"))
            model.n_fit_ = int(model.alive_.sum())
        else:
            run = model.runs_[model.best_]
            model.n_fit_ = int(round(float(run.sizes[-1].sum())))
        return model

    def _replay_run(self, run: _Run, x: np.ndarray):
        """Run metadata after removing x if every quantised centroid and stop decision stays the
        same; None otherwise (nothing is changed either way)."""
        k = int(self.n_clusters)
        n = self.n_fit_ - 1
        T = run.c_out.shape[0]
        new_sums = run.sums.copy()
        new_sizes = run.sizes.copy()
        new_losses = run.losses.copy()
        for t in range(T):
            d2 = ((run.c_in[t] - x) ** 2).sum(axis=1)
            j = int(d2.argmin())
            new_sums[t, j] -= x
            new_sizes[t, j] -= 1
            new_losses[t] -= d2[j]
            q = quantise(
                _balanced(new_sums[t], new_sizes[t], run.c_in[t], self.balance * n / k),
                run.thetas[t],
                float(self.epsilon),
            )
            if not np.array_equal(q, run.c_out[t]):
                return None
        # The early-stop decisions must not flip: every kept step's loss did not increase, and a
        # step that stopped training (T < max_iter) must still see an increase.
        if T > 1 and (np.diff(new_losses) > 0).any():
            return None
        drop = float(((run.c_out[-1] - x) ** 2).sum(axis=1).min())
        stop_loss = run.stop_loss
        if stop_loss is not None:
            stop_loss -= drop
            if not stop_loss > new_losses[-1]:
                return None
        return _Run(
            run.c_in, run.c_out, run.thetas, new_sums, new_sizes, new_losses, stop_loss,
            run.final_loss - drop, run.seed_ids,
        )  # fmt: skip

    def _replay(self, x: np.ndarray) -> list[_Run] | None:
        """Every run replayed without x, if all are certified and the best run stays the best."""
        if self.n_fit_ - 1 < int(self.n_clusters):
            return None
        runs = []
        for run in self.runs_:
            new = self._replay_run(run, x)
            if new is None:
                return None
            runs.append(new)
        if int(np.argmin([run.final_loss for run in runs])) != self.best_:
            return None
        return runs

    def _certify(self, x: np.ndarray) -> bool:
        """Would removing x leave every quantised centroid and decision unchanged? If so, update
        the metadata as retraining without x would have left it."""
        runs = self._replay(x)
        if runs is None:
            return False
        self.runs_ = runs
        self.n_fit_ -= 1
        return True

    def certification_rate(self, n_probe: int = 200, seed: int = 0) -> float:
        """Fraction of ``n_probe`` live points (drawn at random) whose deletion alone would be
        certified: a dry run that changes nothing. It predicts how often deletions will need a
        retrain, so whether ``epsilon`` suits the data (or DC-k-means would serve better)."""
        self._check_fitted()
        check_positive_int(n_probe, "n_probe", "QKMeans.certification_rate")
        rows = np.flatnonzero(self.alive_)
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x50B]))
        rows = rng.choice(rows, size=min(n_probe, rows.shape[0]), replace=False)
        ok = [
            self.ids_[r] not in self.seed_ids_
            and self._replay(self.points_[r].astype(np.float64)) is not None
            for r in rows
        ]
        return float(np.mean(ok)) if ok else 0.0

    def delete(self, ids) -> DeletionReport:
        """Delete a batch of ids one by one; retrain once at the end if any is not certified."""
        report, todo = self._start_deletion(ids)
        certified = 0
        retrain = False
        for r in todo:
            if not retrain and self.ids_[r] not in self.seed_ids_:
                ok = self._certify(self.points_[r].astype(np.float64))
            else:
                ok = False
            if ok:
                certified += 1
            else:
                retrain = True
        if retrain:
            self.n_retrains_ += 1
            self._train()
        report.certified, report.retrained = certified, retrain
        return report

    def predict(self, X: np.ndarray) -> np.ndarray:
        self._check_fitted()
        X = check_estimator_points(X, "QKMeans", "predict", self.n_features_in_)
        return nearest(X, self.centroids_)[0]

    def loss(self, X: np.ndarray) -> float:
        self._check_fitted()
        X = check_estimator_points(X, "QKMeans", "loss", self.n_features_in_)
        return float(nearest(X, self.centroids_)[1].sum())


def _balanced(sums: np.ndarray, sizes: np.ndarray, prev: np.ndarray, threshold: float):
    """Cluster means, small clusters pulled toward ``prev``; an empty cluster keeps ``prev``."""
    mean = np.where(sizes[:, None] > 0, sums / np.maximum(sizes, 1)[:, None], prev)
    small = sizes < threshold
    a = (sizes / threshold)[:, None]
    return np.where(small[:, None], a * mean + (1 - a) * prev, mean)


def choose_model(n: int, d: int, k: int, certification_rate: float | None = None) -> str:
    """``"q"`` or ``"dc"`` from the data's shape, or from a measured certification rate.

    Q-k-means answers most deletions from its metadata, but its certification rate falls with
    dimension (measured: 99.8-100% at d = 7-25 with eps = 0.2; 0-15% on MNIST, d = 784, at eps
    0.05-0.5) and every failed certification costs a full retrain; DC-k-means always recomputes
    one leaf-to-root path (about 1 ms at d = 25). A retrain costs about as much as a thousand DC
    deletions, so Q pays off only when nearly every deletion is certified:

    - with ``certification_rate`` (from :meth:`QKMeans.certification_rate` on a fitted model):
      Q when it is at least 0.99;
    - from the shape alone: Q up to 30 dimensions when clusters hold enough points for the
      lattice to absorb one deletion (n / k >= 1,000), DC otherwise.
    """
    if certification_rate is not None:
        return "q" if certification_rate >= 0.99 else "dc"
    return "q" if d <= 30 and n >= 1000 * k else "dc"
