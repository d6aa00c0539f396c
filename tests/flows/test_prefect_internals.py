"""The one place fairpipe reaches into Prefect's internals: a command's own Prefect server,
launched as Prefect launches its ephemeral server (flows/prefect_server.py says why). If a Prefect
upgrade changes that launch, these tests fail and name what changed."""

from __future__ import annotations

import inspect

import pytest

from fairpipe.flows.prefect_server import EPHEMERAL_ENV, UVICORN_ARGS

UPGRADE = (
    "Prefect {version} launches its ephemeral server differently from flows/prefect_server.py "
    "(LocalServer.launch, UVICORN_ARGS, EPHEMERAL_ENV), which copies it: {what}. Compare with "
    "prefect.server.api.server.SubprocessASGIServer._run_uvicorn_command and update flows/prefect_server.py."
)


WORKERS_MOVED = (
    "Prefect {version} has no {what}: flows/prefect_server.py (RECORD_WORKERS, deliver_records) "
    "drains it so that a command's last events and logs reach the server before the command "
    "ends. Find where Prefect's exit hooks drain its workers now and update RECORD_WORKERS."
)


def prefects_own_launch(monkeypatch) -> tuple[list[str], dict[str, str]]:
    """The command line and environment Prefect's SubprocessASGIServer starts uvicorn with
    (caught, not run)."""
    import prefect.server.api.server as server

    seen: dict = {}

    def caught(*args, **kwargs):
        seen.update(kwargs, args=list(kwargs.get("args", args[0] if args else [])))
        raise RuntimeError("caught")

    monkeypatch.setattr(server.subprocess, "Popen", caught)
    with pytest.raises(RuntimeError, match="caught"):
        server.SubprocessASGIServer(port=1)._run_uvicorn_command()
    return seen["args"], dict(seen.get("env") or {})


def test_a_commands_server_is_launched_as_prefect_launches_its_own(monkeypatch):
    import prefect

    args, env = prefects_own_launch(monkeypatch)
    version = prefect.__version__
    ours = list(UVICORN_ARGS)
    flags = {a for a in args if a.startswith("--")}
    expected = {a for a in ours if a.startswith("--")} | {"--app-dir", "--port"}
    assert flags == expected, UPGRADE.format(
        version=version, what=f"uvicorn's flags {sorted(flags)}"
    )
    for flag, value in zip(ours, ours[1:]):
        if flag.startswith("--") and not value.startswith("--"):
            got = args[args.index(flag) + 1]
            assert got == value, UPGRADE.format(version=version, what=f"{flag} {got}")
    assert args[1:3] == ["-m", "uvicorn"], UPGRADE.format(version=version, what=str(args[:3]))
    missing = {k: v for k, v in EPHEMERAL_ENV.items() if env.get(k) != v}
    assert not missing, UPGRADE.format(version=version, what=f"environment without {missing}")


def test_prefects_app_still_reads_the_ephemeral_variables():
    import prefect
    from prefect.server.api.server import create_app

    source = inspect.getsource(create_app)
    for name in EPHEMERAL_ENV:
        if name.startswith("PREFECT__"):
            assert f'os.getenv("{name}")' in source, UPGRADE.format(
                version=prefect.__version__, what=f"create_app no longer reads {name}"
            )


def test_the_workers_a_command_drains_before_it_ends_are_prefects():
    """fairpipe.flows.prefect_server.deliver_records sends a flow run's last events and logs through
    these workers' ``drain_all(timeout=...)``; an upgrade that moves them fails here, by name."""
    import importlib

    import prefect

    from fairpipe.flows.prefect_server import RECORD_WORKERS

    for module, name in RECORD_WORKERS:
        what = f"{module}.{name}.drain_all(timeout=...)"
        found = getattr(importlib.import_module(module), name, None)
        drain = getattr(found, "drain_all", None)
        moved = WORKERS_MOVED.format(version=prefect.__version__, what=what)
        assert drain is not None and "timeout" in inspect.signature(drain).parameters, moved
