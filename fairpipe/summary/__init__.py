"""Fair data summaries: k representative elements with per-group lower and upper bounds, by fair
streaming submodular maximisation (El Halabi et al., NeurIPS 2020).

- :class:`Utility`: the exemplar (k-medoid) and facility-location objectives.
- :func:`fair_stream` (FSM) and the baselines :func:`msm_stream`, :func:`fair_greedy` (offline,
  the reference) and :func:`random_subset`; :func:`random_feasible_rows` (a random selection
  within the bounds); :func:`check_bounds`, :func:`bound_error`.
- :class:`FairSummary`: FSM merged up a tree, with exact batch deletion. The flows run its
  leaves on Dask (:func:`summarize_leaves`) and hand them to a :class:`SummaryTree` (the tree
  engine's node store of summaries, :meth:`SummaryTree.refresh`), as the estimator does.
- :func:`resolve_bounds`: bounds given as fractions of k or as a JSON file, as counts.
"""

from fairpipe.settings import RULES, UTILITIES
from fairpipe.summary._bounds import bounds_from_fractions, load_bounds_file, resolve_bounds
from fairpipe.summary._fair_streaming import (
    SelectionResult,
    bound_error,
    check_bounds,
    check_groups,
    fair_greedy,
    fair_stream,
    msm_stream,
    random_feasible_rows,
    random_subset,
    stream_kernel,
)
from fairpipe.summary._fair_summary import (
    EVAL_SALT,
    STREAM_SALT,
    FairSummary,
    MergeRule,
    NodeOutput,
    SummaryParams,
    SummaryTree,
    level_arrays,
    merge_children,
    merge_many,
    nodes_from_arrays,
    padded,
    root_figures,
    solve_node,
    summarize_leaf_group,
    summarize_leaves,
    summary_arrays,
)
from fairpipe.summary._utilities import Utility

__all__ = [
    "EVAL_SALT", "RULES", "STREAM_SALT", "UTILITIES", "FairSummary", "NodeOutput",
    "SelectionResult", "SummaryParams", "Utility", "bound_error", "bounds_from_fractions",
    "check_bounds", "check_groups", "fair_greedy", "fair_stream", "level_arrays",
    "load_bounds_file", "MergeRule", "SummaryTree", "merge_children", "merge_many", "msm_stream",
    "nodes_from_arrays", "padded", "random_feasible_rows", "random_subset", "resolve_bounds",
    "root_figures", "solve_node", "stream_kernel", "summarize_leaf_group", "summarize_leaves", "summary_arrays",
]  # fmt: skip
