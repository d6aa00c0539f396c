"""Every old name fairpipe still accepts, each mapped to the library parameter that replaced it:
command-line flags (hidden from ``--help``), the flows' options (deployments and scripts written
before the rename still run) and a store's attributes (read as the current names and rewritten
by the store's next commit). Which layer applies them: the command line
(:func:`fairpipe.flows.cli._runner.merge_renamed`), the options' dataclasses
(:func:`fairpipe.flows.renamed.take_old_names`) and the store (:mod:`fairpipe.storage.names`)."""

from __future__ import annotations

# Per command: old flag -> the parameter that replaced it.
OLD_FLAGS: dict[str, dict[str, str]] = {
    "audit": {"--seeds": "n_seeds", "--local": "n_local"},
    "demo": {"--queries": "n_queries"},
    "fit": {"--k": "n_clusters", "--tree-width": "fanout", "--tree-height": "height",
            "--iterations": "max_iter", "--gamma": "balance"},
    "ingest": {"--lsh-k": "n_hashes", "--lsh-tables": "n_tables", "--lsh-width": "bucket_width"},
    "sample": {"--method": "sampler", "--samples": "n_samples"},
    "summarize": {"--tree-width": "fanout", "--tree-height": "height"},
}  # fmt: skip

# Per flow's options: old option -> the option that replaced it.
OLD_OPTIONS: dict[str, dict[str, str]] = {
    "audit": {"seeds": "n_seeds", "local": "n_local"},
    "fit": {"k": "n_clusters", "width": "fanout", "iterations": "max_iter", "gamma": "balance"},
    "ingest": {"lsh_k": "n_hashes", "lsh_tables": "n_tables", "lsh_width": "bucket_width"},
    "summarize": {"width": "fanout", "bounds_file": "bounds"},
}

# Per place of a store (the root's ``lsh`` attribute, or a group's attributes): old name ->
# current name.
OLD_ATTRIBUTES: dict[str, dict[str, str]] = {
    "lsh": {"k": "n_hashes", "width": "bucket_width"},
    "tree": {"width": "fanout", "iterations": "max_iter"},
    "qkmeans": {"iterations": "max_iter", "gamma": "balance"},
    "summary": {"width": "fanout"},
}
