"""One name per meaning: the command line's flags, the flows' options and the deployments'
parameters are the library's parameter names, with its defaults. The old flags and option names
keep working for one release (hidden); given with their new name, they are bad input."""

import inspect
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fairpipe import DCKMeans, FairSummary, QKMeans
from fairpipe.errors import FairpipeInputError
from fairpipe.flows.cli import app
from fairpipe.flows.options import AuditOptions, FitOptions, IngestOptions, SummarizeOptions

runner = CliRunner()
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prefect.yaml"


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


# Each old flag, with a bad value: the check that refuses it names the new flag, so the old
# flag reached the new option (no store is read).
OLD_FLAGS = [
    ("fit", "--k", "0", "--n-clusters"),
    ("fit", "--tree-width", "1", "--fanout"),
    ("fit", "--tree-height", "0", "--height"),
    ("fit", "--iterations", "0", "--max-iter"),
    ("fit", "--gamma", "1", "--balance"),
    ("summarize", "--tree-width", "1", "--fanout"),
    ("summarize", "--tree-height", "-1", "--height"),
    ("ingest", "--lsh-k", "0", "--n-hashes"),
    ("ingest", "--lsh-tables", "0", "--n-tables"),
    ("ingest", "--lsh-width", "0", "--bucket-width"),
    ("sample", "--samples", "0", "--n-samples"),
    ("audit", "--seeds", "0", "--n-seeds"),
    ("audit", "--local", "0", "--n-local"),
]


@pytest.mark.parametrize(("command", "old", "value", "new"), OLD_FLAGS,
                         ids=[f"{c} {o}" for c, o, _, _ in OLD_FLAGS])  # fmt: skip
def test_an_old_flag_still_sets_its_new_option(tmp_path, command, old, value, new):
    args = {"ingest": ["digits", "--store", tmp_path / "s"], "sample": ["--store", tmp_path,
            "--query-row", 0], "audit": ["--protected", "sex"]}.get(command, ["--store", tmp_path])  # fmt: skip
    out = invoke(command, *args, old, value)
    assert out.exit_code == 2 and out.stderr.startswith(f"error: The {new} option of"), out.stderr
    assert not (tmp_path / "s").exists()


def test_an_old_flag_with_its_new_name_is_refused_and_old_flags_are_hidden(tmp_path):
    out = invoke("fit", "--store", tmp_path, "--n-clusters", 3, "--k", 3)
    assert out.exit_code == 2
    assert out.stderr == "error: Give --n-clusters or its old name --k, not both.\n"
    out = invoke("sample", "--store", tmp_path, "--query-row", 0, "--sampler", "rank",
                 "--method", "rank")  # fmt: skip
    assert out.stderr == "error: Give --sampler or its old name --method, not both.\n"
    shown = invoke("fit", "--help").stdout
    assert "--n-clusters" in shown and "--k " not in shown and "--tree-width" not in shown


def test_sample_by_its_old_flags_on_the_digits_store(digits_store):
    path, _ = digits_store
    out = invoke("sample", "--store", path, "--query-id", 42, "--radius", 25, "--method", "rank",
                 "--samples", 4, "--json")  # fmt: skip
    assert out.exit_code == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["sampler"] == "rank" and len(result["queries"][0]["ids"]) == 4


def test_the_flows_options_take_their_old_names_for_one_release():
    assert FitOptions(k=3, width=4, iterations=5, gamma=0.3) == FitOptions(
        n_clusters=3, fanout=4, max_iter=5, balance=0.3)  # fmt: skip
    assert IngestOptions(lsh_k=2, lsh_tables=3, lsh_width=1.5) == IngestOptions(
        n_hashes=2, n_tables=3, bucket_width=1.5)  # fmt: skip
    assert SummarizeOptions(width=4).fanout == 4
    assert SummarizeOptions(bounds_file="b.json").bounds == "b.json"
    assert (AuditOptions(seeds=5, local=6).n_seeds, AuditOptions(local=6).n_local) == (5, 6)
    with pytest.raises(FairpipeInputError, match="give 'n_clusters' and its old name 'k'"):
        FitOptions(n_clusters=3, k=4)


def test_the_flows_defaults_are_the_librarys():
    fit = FitOptions()
    assert fit.dc_params() == {**DCKMeans().get_params(), "n_init": 10}
    assert fit.q_params() == QKMeans().get_params()
    summary = FairSummary().get_params()
    options = SummarizeOptions()
    for name in ("k", "fanout", "height", "eval_size", "utility", "rule", "factor", "gamma"):
        assert getattr(options, name) == summary[name], name


def test_samples_defaults_are_fairnns():
    """sample's sampler, mode and c are FairNN.sample's defaults (its n_samples, 10, and seed, 0,
    are the command line's own: a library call draws one sample from fresh entropy)."""
    from fairpipe import FairNN
    from fairpipe.flows.cli.sample import sample

    library = inspect.signature(FairNN.sample).parameters
    for p in inspect.signature(sample).parameters.values():
        if p.name in ("sampler", "mode", "c"):
            assert p.default == library[p.name].default, p.name


def test_the_command_lines_defaults_are_the_flows():
    from fairpipe.flows.cli.fit import fit
    from fairpipe.flows.cli.summarize import summarize

    for command, options in ((fit, FitOptions()), (summarize, SummarizeOptions())):
        for p in inspect.signature(command).parameters.values():
            if hasattr(options, p.name) and p.name not in ("lock_timeout", "n_init"):
                assert p.default == getattr(options, p.name), (command.__name__, p.name)


def test_every_deployment_passes_its_flows_current_parameters(prefect_server):
    """deploy/prefect.yaml's parameters validate against each flow's signature, under the
    current names only (an old name would still validate: it is looked for by name)."""
    import importlib

    from fairpipe.old_names import OLD_OPTIONS  # the old names' one place

    old_names = {old for names in OLD_OPTIONS.values() for old in names}
    assert old_names == {"k", "width", "iterations", "gamma", "lsh_k", "lsh_tables", "lsh_width",
                         "seeds", "local", "bounds_file"}  # fmt: skip
    for deployment in yaml.safe_load(DEPLOY.read_text())["deployments"]:
        module, name = deployment["entrypoint"].rsplit(".", 1)
        flow = getattr(importlib.import_module(module), name)
        parameters = deployment["parameters"]
        flow.validate_parameters(parameters)
        options = parameters.get("options", {})
        stale = old_names & set(options) - ({"k"} if name == "summarize_flow" else set())
        assert not stale, (deployment["name"], stale)
    fit_flow = importlib.import_module("fairpipe.flows.fit").fit_flow
    validated = fit_flow.validate_parameters({"store_url": "s", "options": {"k": 16, "width": 4}})
    assert (validated["options"].n_clusters, validated["options"].fanout) == (16, 4)
