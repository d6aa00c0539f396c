"""The one exception handler of the command line: exit 2 and one line for bad input, 3 for a busy
store, 1 and a traceback file for a bug, 130 when interrupted. Results never reach stdout then."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import fairpipe.flows.sample
from fairpipe.errors import FairpipeInputError
from fairpipe.flows.cli import app
from fairpipe.storage.lock import WriterLock, lock_path_for

runner = CliRunner()
SAMPLE = ["sample", "--store", "nowhere", "--query-id", "3"]


def invoke(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env, catch_exceptions=False)


@pytest.fixture
def cache_home(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FAIRPIPE_DEBUG", raising=False)
    return tmp_path / "cache"


def sampler_raising(monkeypatch, make_error):
    def sample_store(*args, **kwargs):
        raise make_error()

    monkeypatch.setattr(fairpipe.flows.sample, "sample_store", sample_store)


def missing_key():
    empty: dict[str, int] = {}
    return empty["x"]


def test_a_bug_exits_1_with_one_line_and_the_traceback_in_a_file(monkeypatch, cache_home):
    sampler_raising(monkeypatch, missing_key)
    monkeypatch.setattr(sys, "argv", ["fairpipe", *SAMPLE])
    out = invoke(*SAMPLE)
    assert out.exit_code == 1 and out.stdout == ""
    summary, where = out.stderr.splitlines()
    assert summary == "fairpipe sample failed with an internal error: KeyError: 'x'"
    path = Path(where.removeprefix("the traceback is in "))
    assert path.parent == cache_home / "fairpipe" / "errors"
    assert re.fullmatch(r"sample-\d{8}T\d{6}-\d+\.txt", path.name)
    report = path.read_text()
    assert report.startswith(summary + "\n")
    assert "Traceback (most recent call last)" in report and "in missing_key" in report
    assert report.rstrip().endswith("KeyError: 'x'")
    # A stored point's id is a person's: the report names the parameter, not its value.
    assert "'query_id': 'REDACTED'" in report and "--query-id REDACTED" in report
    assert "python: 3." in report and "fairpipe 0.1.0" in report
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    # The same bug twice in one second gets a second file.
    again = Path(invoke(*SAMPLE).stderr.splitlines()[1].removeprefix("the traceback is in "))
    assert again != path and again.exists()


def test_fairpipe_debug_prints_the_traceback_instead(monkeypatch, cache_home):
    sampler_raising(monkeypatch, missing_key)
    out = invoke(*SAMPLE, env={"FAIRPIPE_DEBUG": "1"})
    assert out.exit_code == 1 and out.stdout == ""
    lines = out.stderr.splitlines()
    assert lines[0] == "fairpipe sample failed with an internal error: KeyError: 'x'"
    assert lines[1] == "Traceback (most recent call last):" and lines[-1] == "KeyError: 'x'"
    assert "in missing_key" in out.stderr
    assert not cache_home.exists()


def test_no_cache_folder_still_shows_the_traceback(monkeypatch, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    sampler_raising(monkeypatch, missing_key)
    out = invoke(*SAMPLE)
    assert out.exit_code == 1
    assert out.stderr.splitlines()[1].startswith("the traceback could not be written to a file")
    assert "in missing_key" in out.stderr


def bad_input():
    return FairpipeInputError("The 'sampler' parameter of FairNN.sample must be one of 'exact'.")


def wrapped_bad_input():
    error = RuntimeError("Task run failed")  # as a runner wraps the error it re-raises
    error.__cause__ = bad_input()
    return error


def bad_input_in_a_group():
    return ExceptionGroup("unhandled errors in a TaskGroup", [bad_input()])


@pytest.mark.parametrize("make_error", [bad_input, wrapped_bad_input, bad_input_in_a_group])
def test_bad_input_exits_2_with_one_line_naming_the_flag(monkeypatch, cache_home, make_error):
    sampler_raising(monkeypatch, make_error)
    out = invoke(*SAMPLE)
    assert out.exit_code == 2 and out.stdout == ""
    assert out.stderr == (
        "error: The 'sampler' parameter of FairNN.sample must be one of 'exact'. "
        "(option --sampler)\n"
    )
    assert not cache_home.exists()


def test_a_bug_while_handling_bad_input_is_still_a_bug(monkeypatch, cache_home):
    def sample_store(*args, **kwargs):
        try:
            raise bad_input()
        except FairpipeInputError:
            raise KeyError("x")  # noqa: B904  (the point: an implicit __context__, no __cause__)

    monkeypatch.setattr(fairpipe.flows.sample, "sample_store", sample_store)
    out = invoke(*SAMPLE)
    assert out.exit_code == 1
    assert out.stderr.startswith("fairpipe sample failed with an internal error: KeyError: 'x'\n")


def test_bad_input_of_the_command_itself(cache_home, tmp_path):
    out = invoke("forget", "--store", tmp_path / "s", "--ids", "1", "--ids-file", "f.txt")
    assert out.exit_code == 2 and out.stdout == ""
    assert out.stderr == (
        "error: Give at most one of --ids or --ids-file (neither: drain the pending requests).\n"
    )
    (tmp_path / "q.npy").write_text("1 2 3")
    out = invoke("predict", "--store", tmp_path / "s", "--query-file", tmp_path / "q.npy")
    assert out.exit_code == 2 and "is not a .npy array" in out.stderr
    assert len(out.stderr.splitlines()) == 1
    markup = invoke("forget", "--store", tmp_path / "s", "--ids", "1,[bold]x")
    assert markup.stderr == (  # not rich markup
        "error: Id '[bold]x' in --ids is not an integer; ids are integers from 0 to "
        "9223372036854775807.\n"
    )


def test_usage_errors_are_one_line_and_exit_2(cache_home):
    missing = invoke("fit")
    assert missing.exit_code == 2 and len(missing.stderr.splitlines()) == 1
    assert missing.stderr.startswith("error: Missing option '--store'. (see '")
    assert missing.stderr.endswith(" fit --help')\n")  # the program's name: 'fairpipe'"
    wrong = invoke("fit", "--store", "s", "--n-clusters", "three")
    assert wrong.exit_code == 2 and wrong.stderr == (
        "error: The --n-clusters option of fairpipe fit must be an integer: ASCII digits 0-9 "
        "only, without '+', '_' or spaces. Got 'three': it is not a number.\n"
    )
    unknown = invoke("fit", "--store", "s", "--clusters", "3")
    assert unknown.exit_code == 2 and len(unknown.stderr.splitlines()) == 1
    assert unknown.stderr.startswith("error: No such option: --clusters")
    assert not cache_home.exists()


def test_interrupted_exits_130(monkeypatch, cache_home):
    sampler_raising(monkeypatch, KeyboardInterrupt)
    out = invoke(*SAMPLE)
    assert out.exit_code == 130 and out.stderr == "fairpipe sample: interrupted\n"


def kernel_interrupted():
    """What a compiled kernel raises when a signal's handler raised inside it: a SystemError
    whose context is the handler's exception (Prefect's SIGTERM handler: TerminationSignal)."""
    from prefect.exceptions import TerminationSignal

    try:
        raise TerminationSignal(signal=15)
    except TerminationSignal:  # the context only, as numba leaves it: no "from"
        raise SystemError(  # noqa: B904
            "CPUDispatcher(<function _stream>) returned a result with an exception set"
        )


def test_a_signal_inside_a_compiled_kernel_is_interrupted_not_a_bug(monkeypatch, cache_home):
    sampler_raising(monkeypatch, kernel_interrupted)
    out = invoke(*SAMPLE)
    assert out.exit_code == 130 and out.stderr == "fairpipe sample: interrupted\n"
    assert not (cache_home / "fairpipe" / "errors").exists()


def test_a_busy_store_exits_3_and_names_the_lock_timeout(digits_store, cache_home):
    path, _ = digits_store
    url = str(path)
    with WriterLock(lock_path_for(url, Path(url)), url):
        out = invoke("forget", "--store", path, "--ids", "1", "--workers", 1)
    assert out.exit_code == 3 and out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"error: Store {url} is being written by another process")
    # Refused before anything starts: nothing filed, nothing to withdraw.
    assert line.endswith("pass a lock timeout to wait (option --lock-timeout).")
    assert open_ids(path) == 1797  # nothing was forgotten


def open_ids(path) -> int:
    from fairpipe.storage import open_store

    return int(open_store(str(path)).read("alive").sum())


def test_every_command_runs_under_the_one_handler():
    handlers = {c.callback.__code__ for c in app.registered_commands}  # type: ignore[union-attr]
    assert len(handlers) == 1 and len(app.registered_commands) == 18
    (handler,) = handlers
    assert handler.co_name == "run" and handler.co_filename.endswith("flows/cli/_runner.py")


# PyO3's PanicException is a BaseException of the module pyo3_runtime, made when Rust first
# panics; a class of the same name and module stands for it.
PanicException = type("PanicException", (BaseException,), {"__module__": "pyo3_runtime"})


def test_a_rust_panic_is_a_bug_with_a_report(monkeypatch, cache_home):
    sampler_raising(monkeypatch, lambda: PanicException("called `Option::unwrap()` on a None"))
    out = invoke(*SAMPLE)
    assert out.exit_code == 1 and out.stdout == ""
    summary, where = out.stderr.splitlines()
    assert summary == (
        "fairpipe sample failed with an internal error: pyo3_runtime.PanicException: called "
        "`Option::unwrap()` on a None"
    )
    assert Path(where.removeprefix("the traceback is in ")).is_file()


def test_a_panic_over_a_read_only_filesystem_names_the_store(monkeypatch, cache_home):
    message = 'failed to create object store: ICError { kind: Other("Read-only file system (os '
    sampler_raising(monkeypatch, lambda: PanicException(message + 'error 30)") }'))
    out = invoke(*SAMPLE)
    assert out.exit_code == 2 and out.stderr == (
        "error: nowhere is on a read-only filesystem; give a writable --store.\n"
    )


def test_every_command_has_verbose_showing_a_bugs_traceback(monkeypatch, cache_home):
    for command in app.registered_commands:
        name = (command.name or command.callback.__name__).replace("_", "-")  # type: ignore[union-attr]
        assert "--verbose" in invoke(name, "--help").stdout, name
    sampler_raising(monkeypatch, missing_key)
    out = invoke(*SAMPLE, "--verbose")
    assert out.exit_code == 1 and "Traceback (most recent call last)" in out.stderr
    assert not cache_home.exists()


# not one of test_privacy.py's secrets (which it looks for in a copied database)
AN_ID = 271_828_182


def test_a_bug_report_redacts_ids_in_messages_and_arguments(monkeypatch, cache_home):
    from fairpipe.flows.cli._bugs import redacted_argv

    def key_error():
        raise RuntimeError("while forgetting") from KeyError(AN_ID)

    sampler_raising(monkeypatch, key_error)
    out = invoke(*SAMPLE)
    assert out.exit_code == 1 and "RuntimeError: while forgetting" in out.stderr
    report = Path(out.stderr.splitlines()[1].removeprefix("the traceback is in ")).read_text()
    assert str(AN_ID) not in report and "KeyError: <n>" in report
    assert "The above exception was the direct cause" in report
    assert redacted_argv(["fairpipe", "forget", "--ids", "1,2", "--reason=why", "--store", "s"]) == [
        "fairpipe", "forget", "--ids", "REDACTED", "--reason=REDACTED", "--store", "s"
    ]  # fmt: skip


def test_text_from_producers_is_escaped():
    from fairpipe.flows.cli._output import escape_controls, printable

    assert escape_controls("a\nb\x1b[2J\t\x7f\u202e\u2028\x85é名") == (
        "a\\nb\\x1b[2J\\t\\x7f\\u202e\\u2028\\x85é名"
    )
    assert printable({"g\x1b": ["x\ny", 1, None]}) == {"g\\x1b": ["x\\ny", 1, None]}


def test_the_programs_stderr_is_one_line_when_a_worker_fails(prefect_server, tmp_path):
    """Run as the ``fairpipe`` program, on its own local cluster: a worker's failure is one line,
    without distributed's "Compute Failed" log, Prefect's engine traceback or its services'
    warnings (``--verbose`` shows them)."""
    import os
    import subprocess

    points = np.random.default_rng(0).normal(size=(1500, 4)).astype(np.float32)
    points[1200, 2] = np.nan
    np.save(tmp_path / "nan.npy", points)
    exe = sys.executable.replace("python", "fairpipe")
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    for name in ("PREFECT_LOGGING_LEVEL", "PREFECT_LOGGING_ROOT_LEVEL", "DASK_LOGGING"):
        env.pop(name, None)  # as a user's shell has them: unset
    got = subprocess.run([exe, "ingest", str(tmp_path / "nan.npy"), "--store",
                          str(tmp_path / "s"), "--workers", "1", "--chunk-rows", "500"],
                         capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert got.returncode == 2 and got.stdout == ""
    assert got.stderr == (
        "error: Row 1201 of nan.npy holds a NaN value in column 3; points must be finite numbers.\n"
    )
