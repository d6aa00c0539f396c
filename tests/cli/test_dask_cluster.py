"""Clusters a bare address cannot name: a TLS scheduler (its certificates in Dask's
configuration), and a cluster the user's own code makes (``--dask-cluster module:name``: Coiled,
dask-jobqueue, dask-kubernetes), here a TLS LocalCluster whose credentials only its Python object
carries. Commands run in this process (typer's runner), their work on the TLS cluster's worker
process, counted by its scheduler."""

import sys
import textwrap

import pytest
from typer.testing import CliRunner

from fairpipe.errors import FairpipeInputError
from fairpipe.flows import task_runner
from fairpipe.flows.cli import app

runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def tls_cluster(prefect_server, tmp_path_factory):
    """A LocalCluster speaking TLS only (one worker process), its certificates in files, and a
    module ``tls_factory`` beside them whose ``client`` returns a Client that carries them."""
    from distributed import LocalCluster
    from distributed.security import Security

    security = Security.temporary()
    folder = tmp_path_factory.mktemp("tls")
    files = {}
    for name in ("tls_ca_file", "tls_client_cert", "tls_client_key"):
        files[name] = folder / f"{name}.pem"
        files[name].write_text(getattr(security, name))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, security=security,
                      dashboard_address=None,
                      scheduler_kwargs={"dashboard_address": ":0"}) as cluster:  # fmt: skip
        (folder / "tls_factory.py").write_text(
            textwrap.dedent(f"""
            from distributed import Client
            from distributed.security import Security

            def client():
                security = Security(tls_ca_file={str(files["tls_ca_file"])!r},
                                    tls_client_cert={str(files["tls_client_cert"])!r},
                                    tls_client_key={str(files["tls_client_key"])!r},
                                    require_encryption=True)
                return Client({cluster.scheduler_address!r}, security=security)

            MADE = []

            def own_cluster():
                from distributed import LocalCluster

                MADE.append(LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                         security=Security.temporary(), dashboard_address=None,
                                         scheduler_kwargs={{"dashboard_address": ":0"}}))
                return MADE[-1]

            def not_a_cluster():
                return 42

            def broken():
                raise RuntimeError("no credentials for the cloud account")
            """)
        )
        sys.path.insert(0, str(folder))
        try:
            yield cluster, files
        finally:
            sys.path.remove(str(folder))
            sys.modules.pop("tls_factory", None)


def finished(cluster) -> dict[str, int]:
    """Tasks the TLS cluster's scheduler has seen finish, by function name."""
    return {
        name: int(prefix.state_counts.get("memory", 0))
        for name, prefix in cluster.scheduler.task_prefixes.items()
    }


def test_a_cluster_made_by_the_users_callable_runs_ingest_and_fit(tls_cluster, tmp_path):
    cluster, _ = tls_cluster
    store = tmp_path / "s"
    out = invoke("ingest", "gaussian", "--gaussian-n", 3000, "--gaussian-d", 8, "--store", store, "--dask-cluster",
                 "tls_factory:client")  # fmt: skip
    assert out.exit_code == 0, out.output
    out = invoke("fit", "--store", store, "--n-clusters", 4, "--dask-cluster", "tls_factory:client")
    assert out.exit_code == 0, out.output
    counts = finished(cluster)
    assert sum(counts.values()) >= 2, counts  # the work ran on the TLS cluster's worker
    assert counts.get("ingest_chunk", 0) >= 1 and counts.get("pick", 0) >= 1, counts
    assert cluster.scheduler.workers  # its client closed, the cluster up for the next command


def test_a_cluster_object_the_callable_makes_is_closed_at_the_end(tls_cluster, tmp_path):
    import tls_factory

    store = tmp_path / "s"
    out = invoke("ingest", "gaussian", "--gaussian-n", 1000, "--gaussian-d", 4, "--store", store,
                 "--dask-cluster", "tls_factory:own_cluster")  # fmt: skip
    assert out.exit_code == 0, out.output
    made = tls_factory.MADE[-1]
    assert made.scheduler_address.startswith("tls://")
    assert made.status.name == "closed"  # a cluster per command


def test_a_tls_address_with_dasks_tls_configuration(tls_cluster, tmp_path, monkeypatch):
    import dask

    cluster, files = tls_cluster
    before = sum(finished(cluster).values())
    store = tmp_path / "s"
    out = invoke("ingest", "gaussian", "--gaussian-n", 2000, "--gaussian-d", 8, "--store", store, "--dask-address",
                 cluster.scheduler_address)  # fmt: skip
    assert out.exit_code == 2, out.output
    assert "takes TLS" in out.output and "distributed.comm.tls.ca-file" in out.output
    assert not store.exists()
    with dask.config.set({
        "distributed.comm.tls.ca-file": str(files["tls_ca_file"]),
        "distributed.comm.tls.client.cert": str(files["tls_client_cert"]),
        "distributed.comm.tls.client.key": str(files["tls_client_key"]),
    }):  # fmt: skip
        out = invoke("ingest", "gaussian", "--gaussian-n", 2000, "--gaussian-d", 8, "--store", store, "--dask-address",
                     cluster.scheduler_address)  # fmt: skip
    assert out.exit_code == 0, out.output
    assert sum(finished(cluster).values()) > before


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("tls_factory", "must name a Python callable as 'module:name'"),
        ("tcp://10.0.0.5:8786", "must name a Python callable"),
        ("no_such_module_here:make", "cannot be imported: ModuleNotFoundError"),
        ("tls_factory:missing", "cannot be imported: AttributeError"),
        ("tls_factory:not_a_cluster", "returned int, not a Dask cluster or client"),
        ("tls_factory:broken", "failed: RuntimeError: no credentials for the cloud account"),
    ],
)
def test_a_callable_that_gives_no_cluster_is_one_line_exit_2(tls_cluster, tmp_path, spec, match):
    store = tmp_path / "s"
    out = invoke(
        "ingest", "gaussian", "--gaussian-n", 500, "--store", store, "--dask-cluster", spec
    )
    assert out.exit_code == 2, out.output
    assert match in out.output and len(out.output.strip().splitlines()) == 1, out.output
    assert not store.exists()


def test_an_address_and_a_callable_exclude_each_other(tls_cluster):
    cluster, _ = tls_cluster
    with pytest.raises(FairpipeInputError, match="not both"):
        task_runner.run_flow(None, dask_address=cluster.scheduler_address,
                         dask_cluster="tls_factory:client")  # fmt: skip


def test_a_deployment_names_its_callable_in_fairpipe_dask_cluster(tls_cluster, monkeypatch):
    """A deployment's flow run takes its cluster from FAIRPIPE_DASK_CLUSTER (its flow declares
    ``default_task_runner()``, made when the flow run's process imports the flow)."""
    cluster, _ = tls_cluster
    monkeypatch.delenv("FAIRPIPE_DASK_ADDRESS", raising=False)
    monkeypatch.setenv("FAIRPIPE_DASK_CLUSTER", "tls_factory:client")
    made = task_runner.default_task_runner()
    with made:
        client = made.dask_client
        assert client.scheduler.address == cluster.scheduler_address
        assert client.submit(sum, [1, 2, 3]).result() == 6
