"""Fairness testing of classifiers: discriminatory inputs found by ADF (Zhang et al.), AEQUITAS
and random search, the discrimination check and rate, model adapters (probabilities and input
gradients of scikit-learn, PyTorch or any classifier), and retraining with what was found."""

from fairpipe.audit._adapters import (
    FiniteDifferenceAdapter,
    MLPAdapter,
    TorchAdapter,
    adapter_for,
    load_model,
)
from fairpipe.audit._adf import adf_search, cluster_seeds, global_generation, local_generation
from fairpipe.audit._aequitas import aequitas_global, aequitas_local, aequitas_search
from fairpipe.audit._discrimination import (
    Domain,
    SearchResult,
    Tally,
    check_discrimination,
    discrimination_rate,
    objective_gradient,
    random_search,
)
from fairpipe.audit._reporting import merge_batches, plot_traces, search_figures, time_to
from fairpipe.audit._retraining import (
    check_refittable,
    fit_quietly,
    majority_labels,
    paper_mlp,
    retraining_improvement,
)
from fairpipe.settings import OBJECTIVES

__all__ = [
    "OBJECTIVES", "Domain", "FiniteDifferenceAdapter", "MLPAdapter", "SearchResult", "Tally",
    "TorchAdapter", "adapter_for", "adf_search", "aequitas_global", "aequitas_local",
    "aequitas_search", "check_discrimination", "check_refittable", "cluster_seeds",
    "discrimination_rate", "fit_quietly", "global_generation", "load_model", "local_generation",
    "majority_labels", "merge_batches", "objective_gradient", "paper_mlp", "plot_traces",
    "random_search", "retraining_improvement", "search_figures", "time_to",
]  # fmt: skip
