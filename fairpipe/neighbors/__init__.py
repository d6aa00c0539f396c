"""Fair near-neighbour sampling through LSH buckets (Har-Peled & Mahabadi, NeurIPS 2019).

- :class:`E2LSH`: the hash functions and the bucket keys of points.
- :class:`BucketIndex` (with :class:`KeyDirectory`): every table's buckets, found per key.
- :func:`build_segments`, :func:`patch`, :func:`bucket_members`: the buckets cut into segments
  that change independently (the stored index's layout).
- :class:`FairNN`: fit, sample (``exact``, ``approx``, ``rank``, ``uniform``, ``weighted``
  samplers over ``buckets``, ``approximate`` or ``exact`` neighbourhoods) and delete.
- :func:`sketch_points`, :func:`sketch_bounds`: a byte per coordinate of each point, and the
  distance bounds it gives (a stored query reads it instead of most candidates' points);
  :func:`sketch_levels`, :func:`residual_bounds`: with a residual byte per coordinate that
  tightens them about 200 times.
- :func:`evaluate_tv`, :func:`tv_to_uniform`, :func:`noise_floor`: how fair the samples are;
  :func:`true_balls`, :func:`coverage`, :func:`expected_tv_on_ball`: measured on the true ball
  B(q, r), found by brute force.
- :func:`estimate_bucket_width`: a bucket width from the data.
- :func:`choose_lsh_parameters`: k, L and w for a target recall at the query radius, at the
  least expected cost (:func:`collision_probability`, :func:`lsh_recall`,
  :class:`DistanceProfile`, :class:`LSHChoice`).
"""

from fairpipe.neighbors._bucket_index import BucketIndex, build_table, remove_rows
from fairpipe.neighbors._bucket_width import (
    WIDTH_PER_RADIUS,
    estimate_bucket_width,
    width_sample_rows,
)
from fairpipe.neighbors._degree_sampling import (
    PATHS,
    QueryStats,
    sample_query,
)
from fairpipe.neighbors._evaluation import (
    EVALUATED_SAMPLERS,
    chi_square_uniform,
    coverage,
    evaluate_tv,
    expected_tv_on_ball,
    hash_order,
    noise_floor,
    pick_queries,
    plot_tv,
    true_ball,
    true_balls,
    tv_margin,
    tv_to_uniform,
)
from fairpipe.neighbors._fair_nn import (
    MAX_SAMPLES,
    FairNN,
    SampleResult,
    check_sample_count,
    check_sample_options,
    query_generator,
)
from fairpipe.neighbors._key_directory import KeyDirectory
from fairpipe.neighbors._lsh import (
    E2LSH,
    HASH_MASK,
    LSH_ARRAYS,
    RADIUS_TOLERANCE,
    ROW_BLOCK,
    TABLE_SHIFT,
    Scale,
    check_projection_size,
    check_scales,
)
from fairpipe.neighbors._pack import warm_index_kernels
from fairpipe.neighbors._parameters import (
    DEFAULT_RECALL,
    MAX_CHOSEN_TABLES,
    MAX_RADIUS_FACTOR,
    TABLE_COST,
    DistanceProfile,
    EmptyBalls,
    LSHChoice,
    MaxBelowRadius,
    UnreachableRecall,
    choose_lsh_parameters,
    choose_scales,
    collision_probability,
    lsh_recall,
    max_radius_of,
    scale_radii,
    scales_above,
    scales_params,
)
from fairpipe.neighbors._query_buckets import (
    degree_of,
    neighbourhood,
    sq_distances,
    unique_ints,
    unique_inverse_ints,
)
from fairpipe.neighbors._rank_sampling import RankState
from fairpipe.neighbors._segments import (
    MAX_ROWS,
    NotInBucket,
    bucket_members,
    build_segments,
    decode,
    entries,
    mix,
    pack,
    pack_runs,
    partition_bits,
    patch,
    segment_of,
    segment_problem,
    unmix,
)
from fairpipe.neighbors._sketch import (
    RESIDUAL_EXTRA,
    SKETCH_EXTRA,
    ambiguous,
    residual_bounds,
    sketch_bounds,
    sketch_levels,
    sketch_points,
)
from fairpipe.settings import MAX_TABLES, MODES, SAMPLERS

__all__ = [
    "MAX_SAMPLES", "MAX_TABLES", "check_projection_size", "unique_inverse_ints", "warm_index_kernels",
    "E2LSH", "Scale", "check_scales", "RADIUS_TOLERANCE", "HASH_MASK", "TABLE_SHIFT", "EVALUATED_SAMPLERS", "LSH_ARRAYS", "MODES", "PATHS", "ROW_BLOCK", "SAMPLERS", "WIDTH_PER_RADIUS",
    "BucketIndex", "FairNN", "KeyDirectory", "QueryStats", "RankState", "SampleResult",
    "build_table", "chi_square_uniform", "degree_of", "estimate_bucket_width", "evaluate_tv",
    "hash_order", "neighbourhood", "noise_floor", "pick_queries", "plot_tv", "remove_rows",
    "sample_query", "tv_to_uniform", "unique_ints", "width_sample_rows", "build_segments", "bucket_members",
    "check_sample_count", "check_sample_options", "query_generator", "decode", "entries", "NotInBucket", "mix", "pack", "pack_runs",
    "partition_bits", "patch", "segment_of", "segment_problem", "unmix", "MAX_ROWS", "SKETCH_EXTRA", "ambiguous",
    "sketch_bounds", "sketch_points", "sq_distances", "RESIDUAL_EXTRA", "residual_bounds",
    "sketch_levels",
    "coverage", "expected_tv_on_ball", "true_ball", "true_balls", "tv_margin", "DEFAULT_RECALL", "MAX_CHOSEN_TABLES", "TABLE_COST", "DistanceProfile",
    "EmptyBalls", "LSHChoice", "MaxBelowRadius", "UnreachableRecall", "choose_lsh_parameters", "choose_scales", "scale_radii", "scales_above", "scales_params", "max_radius_of", "MAX_RADIUS_FACTOR",
    "collision_probability", "lsh_recall",
]  # fmt: skip
