"""What Prefect may record of a flow run (flows/private.py): private parameters as "<private>",
errors as a type and a reference. In-process, no server: the records are what Prefect's own
serializers make of them."""

from __future__ import annotations

import inspect
import pickle

import cloudpickle
import numpy as np
import pytest

from fairpipe.errors import FairpipeInputError
from fairpipe.flows.backfill import backfill_flow
from fairpipe.flows.forget import forget_flow
from fairpipe.flows.options import BackfillOptions, ForgetOptions
from fairpipe.flows.private import Private, RedactedError, conceal, flow, reveal, task
from fairpipe.flows.task_runner import _concealed

# not one of test_privacy.py's secrets (which it looks for in a copied database)
AN_ID = 271_828_182


def test_private_parameters_are_recorded_as_placeholders():
    given = forget_flow_arguments(
        "s", np.array([AN_ID]), options=ForgetOptions(reason="Zorblax asked", max_batch=7)
    )
    parameters = forget_flow.serialize_parameters(given)
    assert parameters == {
        "store_url": "s",
        "ids": "<private>",
        "options": {"lock_timeout": 0.0, "unapplied": "withdraw", "purge_history": False,
                    "max_batch": 7, "reason": "<private>"},
    }  # fmt: skip
    # Prefect's validation keeps them; the flow's function gets the values.
    validated = forget_flow.validate_parameters(given)
    assert isinstance(validated["ids"], Private) and reveal(validated["ids"]).tolist() == [AN_ID]
    assert reveal(validated["options"]) == ForgetOptions(reason="Zorblax asked", max_batch=7)
    args, kwargs = _concealed(backfill_flow, ("s", "ids.txt"), {"options": BackfillOptions()})
    assert backfill_flow.serialize_parameters({"options": args[2]})["options"]["reason"] == (
        "<private>"
    )


def forget_flow_arguments(*args, **kwargs) -> dict:
    """The parameters run_flow gives forget_flow, by name."""
    args, kwargs = _concealed(forget_flow, args, kwargs)
    return dict(inspect.signature(forget_flow.fn).bind(*args, **kwargs).arguments)


def test_conceal_and_reveal():
    assert conceal(None) is None and reveal(5) == 5
    hidden = conceal([AN_ID])
    assert repr(hidden) == str(hidden) == "<private>" and reveal(hidden) == [AN_ID]
    assert conceal(hidden) is hidden  # not wrapped twice
    options = ForgetOptions(reason="why")
    assert isinstance(conceal(options).reason, Private) and reveal(conceal(options)) == options


def _raise_with_id():
    raise FairpipeInputError(f"Id {AN_ID} of a.csv is already in the store s.")


def test_a_flows_error_is_recorded_as_its_type_and_a_reference():
    wrapped = flow(name="t")(_raise_with_id).fn  # the function Prefect calls
    with pytest.raises(RedactedError) as raised:
        wrapped()
    error = raised.value
    assert str(AN_ID) not in str(error) and "FairpipeInputError" in str(error)
    assert error.reference in str(error) and isinstance(error.original, FairpipeInputError)
    assert error.__context__ is None and error.__cause__ is None  # nothing chained to pickle
    # What Prefect pickles into its result storage holds the reference only.
    for dumps in (pickle.dumps, cloudpickle.dumps):
        data = dumps(error)
        assert str(AN_ID).encode() not in data
        again = pickle.loads(data)
        assert again.reference == error.reference and again.original is None


def test_a_tasks_error_carries_the_original_to_the_flow():
    """A task's redacted error goes from a Dask worker to the flow's process (pickled, never
    persisted): the original travels with it, and the flow's error takes its reference."""
    carried = task(name="t")(_raise_with_id).fn
    with pytest.raises(RedactedError) as raised:
        carried()
    travelled = cloudpickle.loads(cloudpickle.dumps(raised.value))
    assert isinstance(travelled.original, FairpipeInputError)
    assert str(AN_ID) in str(travelled.original) and str(AN_ID) not in str(travelled)

    def flow_body():
        raise travelled

    with pytest.raises(RedactedError) as in_flow:
        flow(name="f")(flow_body).fn()
    assert in_flow.value.reference == travelled.reference
    assert in_flow.value.original is travelled.original
    assert str(AN_ID).encode() not in pickle.dumps(in_flow.value)


def test_a_flow_keeps_its_signature_for_prefect():
    from prefect.utilities.callables import parameter_schema

    schema = parameter_schema(forget_flow)
    assert list(schema.properties) == ["store_url", "ids", "options"]
    assert forget_flow.fn.__name__ == "forget_flow" and forget_flow.persist_result is False


def test_interruptions_pass_unredacted():
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        flow(name="i")(interrupted).fn()


@flow(name="fairpipe-probe", log_prints=False)
def named_probe(store_url: str, ids=None) -> str:
    from prefect.runtime import flow_run

    return flow_run.name


@flow(name="fairpipe-probe-alone", log_prints=False)
def unnamed_probe(k: int) -> str:
    from prefect.runtime import flow_run

    return flow_run.name


def test_flow_runs_are_named_after_the_command_and_the_store(prefect_server):
    from fairpipe.flows.task_runner import run_flow

    assert run_flow(named_probe, "/data/stores/people/", [AN_ID], processes=False) == "probe people"
    assert run_flow(named_probe, "s3://bucket/prefix/people") == "probe people"
    assert run_flow(unnamed_probe, 3) == "probe-alone"
