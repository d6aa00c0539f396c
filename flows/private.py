"""What Prefect records of a flow run, and what it must not: the ids of people and the reasons
given for forgetting them.

Prefect keeps a flow run's parameters in its database, and a failed run's error in three places:
its state's message (in the database and its events), its logs, and the pickled exception in its
result storage under ``PREFECT_HOME`` (none of which a forget erases). So:

- A flow's and a task's errors are recorded as a reference: :func:`flow` and :func:`task` are
  Prefect's decorators whose function raises a :class:`RedactedError` (the original error's type
  and an opaque reference, never its message) in place of any error. The original stays in this
  process (a Dask worker's goes with the redacted error to the flow's process, never into
  Prefect's records): :func:`fairpipe.flows.task_runner.run_flow` raises it again to its caller, and a flow
  run without it (a deployment's) writes it on its own stderr. Results are never persisted.
- A parameter Prefect must not record is given wrapped in :class:`Private` (recorded as
  ``"<private>"``; the flow's function receives the value): :func:`fairpipe.flows.task_runner.run_flow` wraps
  the parameters a flow declares private (``@flow(private=("ids",))``) and the fields of an
  options dataclass declared with ``field(metadata=PRIVATE)``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, model_serializer

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

REDACTED = "{kind} (its message is kept out of Prefect's records; reference {reference})"
UNREPORTED = "fairpipe flow {name} failed: {kind}: {message} (reference {reference})\n"

# Set while a caller that raises a flow's original error again runs it (run_flow).
CALLER_REPORTS: ContextVar[bool] = ContextVar("fairpipe_caller_reports", default=False)


class Private(BaseModel):
    """A flow parameter Prefect records as ``"<private>"``; the flow's function gets ``value``."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)
    value: Any

    @model_serializer
    def _as_recorded(self) -> str:  # Prefect records parameters through this (jsonable_encoder)
        return "<private>"

    def __repr__(self) -> str:
        return "<private>"

    __str__ = __repr__


def conceal(value: T) -> T:
    """``value`` wrapped in :class:`Private` (typed as itself: the flow's function sees it so);
    an options dataclass gets its private fields wrapped instead."""
    if value is None or isinstance(value, Private):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        hidden = {
            f.name: Private(value=getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.metadata.get("private") and not isinstance(getattr(value, f.name), Private)
        }
        return dataclasses.replace(value, **hidden) if hidden else value  # type: ignore[type-var]
    return Private(value=value)  # type: ignore[return-value]


def reveal(value: T) -> T:
    """The inverse of :func:`conceal`."""
    if isinstance(value, Private):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        shown = {
            f.name: getattr(value, f.name).value
            for f in dataclasses.fields(value)
            if isinstance(getattr(value, f.name), Private)
        }
        return dataclasses.replace(value, **shown) if shown else value  # type: ignore[type-var]
    return value


class RedactedError(Exception):
    """An error as Prefect records it: the original's type and a reference, not its message.

    ``original`` is the error itself, in memory only: it is pickled (``carried``) only by a task's
    redacted error, on its way from a Dask worker to the flow's process (a task's result, its
    error included, is never persisted); the flow's own redacted error, which Prefect pickles
    into its result storage, holds none.
    """

    def __init__(self, kind: str, reference: str, carried: BaseException | None = None):
        super().__init__(REDACTED.format(kind=kind, reference=reference))
        self.kind = kind
        self.reference = reference
        self.carried = carried
        self.original: BaseException | None = carried

    def __reduce__(self):
        return (type(self), (self.kind, self.reference, self.carried))


def kind_of(exc: BaseException) -> str:
    """``KeyError``, ``fairpipe.errors.FairpipeInputError``: the type's name, with its module
    unless it is a builtin."""
    kind = type(exc)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def is_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is a Rust panic raised through PyO3 (``pyo3_runtime.PanicException``, a
    BaseException: Icechunk's code panics on some storage errors)."""
    return type(exc).__name__ == "PanicException" and type(exc).__module__ == "pyo3_runtime"


def _redacting(fn: Callable, carry: bool, name: str | None = None) -> Callable:
    """``fn`` with its private arguments revealed, raising a RedactedError for any error (a Rust
    panic included): carrying the original (a task's), or holding it in memory only (a flow's)."""

    # The wrapper names nothing but a function of this module: a task's travels to Dask workers
    # by value (cloudpickle), and this module's globals (a ContextVar) cannot be pickled.
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return _call_redacting(fn, carry, name, args, kwargs)

    # Prefect reads the parameters' types from the signature, resolving names in the function's
    # module: the wrapper's is this one, so they are resolved here, in the flow's module.
    run.__signature__ = inspect.signature(fn, eval_str=True)  # type: ignore[attr-defined]
    return run


def _call_redacting(fn: Callable, carry: bool, name: str | None, args: tuple, kwargs: dict):
    try:
        return fn(*map(reveal, args), **{k: reveal(v) for k, v in kwargs.items()})
    except Exception as exc:
        error: BaseException = exc
    except BaseException as exc:
        if not is_panic(exc):
            raise  # interruptions, exits and Prefect's own signals pass as they are
        error = exc
    # Raised outside the handler: the redacted error has no context to pickle or log.
    if isinstance(error, RedactedError) and error.original is not None:
        original, reference = error.original, error.reference  # a task's, in a flow
    else:
        original, reference = error, uuid.uuid4().hex[:12]
    redacted = RedactedError(kind_of(original), reference, original if carry else None)
    redacted.original = original
    if not carry and not CALLER_REPORTS.get():
        message = " ".join(str(original).split())
        sys.stderr.write(UNREPORTED.format(name=name, kind=kind_of(original), message=message,
                                           reference=reference))  # fmt: skip
    raise redacted


def flow(*, private: tuple[str, ...] = (), **options: Any) -> Callable[[F], Any]:
    """Prefect's ``@flow(**options)``, recording errors as references (see the module), never
    persisting results, its runs named after the command and the store (:func:`run_name`);
    ``private``: the parameters :func:`fairpipe.flows.task_runner.run_flow` conceals."""
    import prefect

    options.setdefault("persist_result", False)
    command = str(options.get("name", "")).removeprefix("fairpipe-")
    if command:
        options.setdefault("flow_run_name", functools.partial(run_name, command))

    def decorate(fn: F) -> Any:
        run = _redacting(fn, carry=False, name=options.get("name", fn.__name__))
        run.private_parameters = private  # type: ignore[attr-defined]
        return prefect.flow(**options)(run)

    return decorate


# The parameter naming what a flow works on, in order of preference: its store, else its input.
NAMED_PARAMETERS = ("store_url", "candidates", "source")


def run_name(command: str) -> str:
    """The name of a flow run of ``command``: ``forget people`` (the store's last path part, or
    the input file's name), or the command alone. Called by Prefect as the run starts."""
    from prefect.runtime import flow_run

    parameters = flow_run.parameters or {}
    for name in NAMED_PARAMETERS:
        value = reveal(parameters.get(name))
        if isinstance(value, str) and value.strip("/"):
            return f"{command} {value.rstrip('/').rsplit('/', 1)[-1]}"
    return command


def task(**options: Any) -> Callable[[F], Any]:
    """Prefect's ``@task(**options)``, recording errors as references (see the module), never
    persisting results."""
    import prefect

    options.setdefault("persist_result", False)

    def decorate(fn: F) -> Any:
        return prefect.task(**options)(_redacting(fn, carry=True))

    return decorate
