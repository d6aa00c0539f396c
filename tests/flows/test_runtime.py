"""How a command runs its flow (fairpipe.flows.task_runner.run_flow)."""

from __future__ import annotations

import os

from prefect import flow, task

from fairpipe.flows.dask_map import cluster_running, on_cluster
from fairpipe.flows.prefect_api import HEARTBEAT_VARIABLES
from fairpipe.flows.task_runner import run_flow, task_runner


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


@task(name="fairpipe-test-where")
def where_task() -> tuple[int, int]:
    return os.getpid(), on_cluster(os.getpid)


@flow(name="fairpipe-test-where")
def where_flow() -> tuple[tuple[int, int], bool]:
    return where_task.submit().result(), cluster_running()


def test_prefect_tasks_run_in_the_flows_process_and_send_their_work_to_dask(prefect_server):
    """No Dask worker runs a Prefect task (it would need the Prefect API, which a real cluster's
    workers cannot reach): the task runs here, its job on a worker process."""
    (task_pid, job_pid), running = run_flow(where_flow, n_workers=1)
    assert task_pid == os.getpid() and job_pid != os.getpid() and running
    assert cluster_running() is False  # outside a flow run


def test_the_flows_task_runner_is_prefects_thread_pool_runner():
    from prefect.task_runners import ThreadPoolTaskRunner

    runner = task_runner("tcp://10.0.0.5:8786")
    assert isinstance(runner, ThreadPoolTaskRunner)
    copy = runner.duplicate()  # what the flow engine enters
    assert (copy.address, copy.n_workers, copy.processes) == ("tcp://10.0.0.5:8786", 2, True)
