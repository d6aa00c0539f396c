"""How a command runs its flow (flows.runtime.run_flow)."""

from __future__ import annotations

from prefect import flow

from flows.runtime import HEARTBEAT_VARIABLES, run_flow


@flow(name="fairpipe-test-heartbeat")
def heartbeat_of_this_run() -> int | None:
    from prefect.settings import get_current_settings

    return get_current_settings().flows.heartbeat_frequency


def test_a_command_flow_sends_no_heartbeats_unless_asked(prefect_server, monkeypatch):
    """Prefect's heartbeat thread made every flow run wait up to a second at its end: a command's
    flow runs without it, and a user who sets the frequency gets Prefect's own behaviour."""
    for name in HEARTBEAT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert run_flow(heartbeat_of_this_run) is None
    monkeypatch.setenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "60")
    assert run_flow(heartbeat_of_this_run) is not None
