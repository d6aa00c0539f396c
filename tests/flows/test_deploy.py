"""deploy/prefect.yaml: every deployment names a real flow and parameters that flow accepts."""

import importlib
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prefect.yaml"


def test_every_deployment_points_at_a_flow_with_valid_parameters():
    spec = yaml.safe_load(DEPLOY.read_text())
    names = []
    for d in spec["deployments"]:
        path, _, name = d["entrypoint"].partition(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        flow = getattr(module, name)
        # Raises on a missing, mistyped or unknown parameter (options fields included).
        flow.validate_parameters(d.get("parameters", {}))
        names.append(flow.name)
    assert {"fairpipe-ingest", "fairpipe-audit"} <= set(names)
