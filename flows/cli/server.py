"""``fairpipe server start | stop | status``: a local Prefect server the user keeps running, which
every command then uses instead of starting its own (:mod:`fairpipe.flows.prefect_server`)."""

from __future__ import annotations

import os
from typing import Any

import typer

from fairpipe.flows.cli._output import result_console
from fairpipe.flows.cli._runner import Shared, command
from fairpipe.settings import PORT

app = typer.Typer(
    no_args_is_help=True,
    help="A local Prefect server that the commands use while it runs (started once, kept "
    "running until stopped), instead of starting one each.",
)


def _render_start(r: dict) -> None:
    result_console().print(
        f"Prefect server running at {r['url']} (pid {r['pid']}; UI {r['ui']}); commands use it "
        f"until 'fairpipe server stop'. Log: {r['log']}"
    )


def _render_stop(r: dict) -> None:
    result_console().print(f"stopped the Prefect server at {r['url']} (pid {r['pid']})")


def _render_status(r: dict) -> None:
    out = result_console()
    if r["running"]:
        out.print(f"a Prefect server runs at {r['url']} (pid {r['pid']}); log: {r['log']}")
    else:
        out.print("no Prefect server of 'fairpipe server start' runs")
    if r["prefect_api_url"]:
        out.print(f"commands use PREFECT_API_URL={r['prefect_api_url']} (it comes first)")


def _as_dict(server) -> dict:
    return {"pid": server.pid, "url": server.url, "ui": server.ui_url, "log": server.log}


@command(render=_render_start, name="server start", settings=(PORT,))
def start(*, shared: Shared, **settings: Any) -> dict:
    """Start a Prefect server (Prefect's 'prefect server start', with its UI) that keeps running
    after this command; every command uses it until 'fairpipe server stop'.

    \b
    Example:
      fairpipe server start
    """
    from fairpipe.flows.prefect_server import start_kept_server

    return _as_dict(start_kept_server(settings["port"]))


@command(render=_render_stop, name="server stop")
def stop(*, shared: Shared) -> dict:
    """Stop the Prefect server of 'fairpipe server start'.

    \b
    Example:
      fairpipe server stop
    """
    from fairpipe.flows.prefect_server import stop_kept_server

    return _as_dict(stop_kept_server())


@command(render=_render_status, name="server status", read_only=True)
def status(*, shared: Shared) -> dict:
    """Whether a Prefect server of 'fairpipe server start' runs, and its address.

    \b
    Example:
      fairpipe server status --json
    """
    from fairpipe.flows.prefect_server import kept_server, pid_file

    server = kept_server()
    found = _as_dict(server) if server is not None else {}
    return {"running": server is not None, **found, "pid_file": str(pid_file()),
            "prefect_api_url": os.environ.get("PREFECT_API_URL") or None}  # fmt: skip


app.command("start")(start)
app.command("stop")(stop)
app.command("status")(status)
