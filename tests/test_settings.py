"""Each setting is declared once (fairpipe.settings): the estimators, the flows' options and the
command line's flags take their defaults, help and checks from that declaration, and no command
declares a setting's flag again."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import typer.main

from fairpipe import settings as S
from fairpipe.cluster import DCKMeans, QKMeans
from fairpipe.errors import FairpipeInputError
from fairpipe.flows.cli import app
from fairpipe.flows.options import (
    AuditOptions,
    BackfillOptions,
    FitOptions,
    ForgetOptions,
    IngestOptions,
    RerankOptions,
    SummarizeOptions,
)
from fairpipe.neighbors import E2LSH
from fairpipe.summary import FairSummary

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = {FitOptions: S.FIT, SummarizeOptions: S.SUMMARIZE, IngestOptions: S.INDEX,
           ForgetOptions: S.FORGET, BackfillOptions: S.BACKFILL, RerankOptions: S.RERANK,
           AuditOptions: S.AUDIT}  # fmt: skip
ESTIMATORS = {e: S.ESTIMATORS[e.__name__] for e in (DCKMeans, QKMeans, E2LSH, FairSummary)}


def command_params(name: str) -> dict:
    command = typer.main.get_command(app)
    for word in name.split():  # "server start": a command of a group
        command = command.commands[word]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params if p.name}


@pytest.mark.parametrize("name", sorted(S.COMMANDS))
def test_every_settings_flag_is_its_declaration(name):
    params = command_params(name)
    for s in S.COMMANDS[name]:
        p = params[s.name]
        assert p.__class__.__name__.endswith("Option")
        assert p.opts == [s.flag], (name, s.name)
        default = None if s.default is S.REQUIRED else s.default
        given = list(p.default) if isinstance(p.default, tuple) else p.default
        assert given == default and p.help == s.help, (name, s.name)
        assert p.required == (s.default is S.REQUIRED), (name, s.name)
        if s.rule is not None and s.rule.choices:
            assert p.metavar == "[" + "|".join(s.rule.choices) + "]", (name, s.name)


@pytest.mark.parametrize("options", list(OPTIONS), ids=lambda o: o.__name__)
def test_the_flows_options_take_the_settings_defaults(options):
    defaults = {f.name: f.default for f in dataclasses.fields(options)}
    for s in OPTIONS[options]:
        assert defaults[s.name] == s.default, (options.__name__, s.name)


@pytest.mark.parametrize("estimator", list(ESTIMATORS), ids=lambda e: e.__name__)
def test_the_estimators_take_the_settings_defaults_and_rules(estimator):
    params = estimator().get_params()
    declared = {s.name: s for s in ESTIMATORS[estimator]}
    assert set(declared) <= set(params)
    for name, s in declared.items():
        assert params[name] == s.default, (estimator.__name__, name)


BAD = {int: -7, float: float("nan"), str: "no-such-choice"}


def ruled_settings() -> list[S.Setting]:
    return [s for s in vars(S).values() if isinstance(s, S.Setting) and s.rule is not None
            and s.kind in BAD]  # fmt: skip


@pytest.mark.parametrize("setting", ruled_settings(), ids=lambda s: s.flag)
def test_one_rule_names_the_parameter_or_the_flag(setting):
    """The library and the command line refuse a bad value by the same rule, with one message
    naming the parameter (an estimator) or the flag (a command)."""
    bad = BAD[setting.kind]
    if setting.kind is str and not setting.rule.choices:
        bad = "x" * (S.MAX_REASON_CHARS + 1)  # a text setting's rule: its length
    with pytest.raises(FairpipeInputError) as by_name:
        setting.check(bad, "Owner")
    with pytest.raises(FairpipeInputError) as by_flag:
        setting.check(bad, "fairpipe cmd", by_flag=True)
    as_named = str(by_name.value).replace(f"The {setting.name!r} parameter of Owner", "SUBJECT")
    as_flagged = str(by_flag.value).replace(f"The {setting.flag} option of fairpipe cmd",
                                            "SUBJECT")  # fmt: skip
    if setting.flag in as_flagged:  # a message naming the value's source in its own words
        as_named, as_flagged = (as_named.replace(setting.name, "NAME"),
                                as_flagged.replace(setting.flag, "NAME"))  # fmt: skip
    assert as_named == as_flagged
    if setting.default is not None:
        assert setting.check(setting.default, "Owner") == setting.default


def test_every_flag_is_a_settings_declaration():
    """No command module spells a flag in a typer.Option: every flag comes from a setting's one
    declaration (the program's own --version aside), so no flag is declared twice."""
    found = []
    for path in sorted((ROOT / "flows" / "cli").glob("*.py")):
        found += [(path.name, flag) for flag in
                  re.findall(r'typer\.Option\(\s*(?:False,\s*)?"(--[a-z-]+)"', path.read_text())]  # fmt: skip
    assert found == [("__init__.py", "--version")]
    flags = [s.flag for settings in (*S.COMMANDS.values(), *S.SHARED.values()) for s in settings]
    assert {"--store", "--json", "--verbose", "--dask-address", "--workers"} <= set(flags)


def test_the_settings_reference_is_generated_from_the_declarations():
    page = ROOT / "docs" / "reference" / "settings.md"
    assert page.read_text() == S.reference(), "run: python -m fairpipe.settings > " + str(page)


def synopses() -> dict[str, str]:
    """Each command's synopsis in docs/reference/commands-*.md (its ```text lines from
    ``fairpipe NAME`` on), by command name."""
    found: dict[str, str] = {}
    for page in sorted((ROOT / "docs" / "reference").glob("commands-*.md")):
        for block in re.findall(r"```text\n(.*?)```", page.read_text(), re.S):
            name = None
            for line in block.splitlines():
                if m := re.match(r"fairpipe ((?:server )?[a-z-]+)", line):
                    name = m.group(1)
                if name:
                    found[name] = found.get(name, "") + line + "\n"
    return found


def visible_commands() -> list[str]:
    root = typer.main.get_command(app)
    names = []
    for name, cmd in root.commands.items():  # type: ignore[attr-defined]
        if not cmd.hidden:
            subs = getattr(cmd, "commands", None)
            names += [f"{name} {sub}" for sub in subs] if subs else [name]
    return sorted(names)


@pytest.mark.parametrize("name", visible_commands())
def test_every_commands_synopsis_names_exactly_its_options(name):
    """The reference's synopsis of each command names each of its visible options, and no
    other: kept by the command's own declarations."""
    text = synopses().get(name)
    assert text is not None, f"docs/reference/commands-*.md has no synopsis of fairpipe {name}"
    options = {opt for p in command_params(name).values()
               if p.__class__.__name__.endswith("Option") and not p.hidden
               for opt in p.opts if opt.startswith("--")} - {"--help"}  # fmt: skip
    named = set(re.findall(r"(--[a-z][a-z-]*)", text))
    assert named <= options, (name, sorted(named - options))
    # The shared options of a flow (--dask-cluster, --verbose) are the shared page's.
    assert options - named <= {"--dask-cluster", "--verbose"}, (name, sorted(options - named))


FLOW_SETTINGS = {
    "ingest_flow": (*S.SOURCE, *S.INDEX), "forget_flow": S.FORGET, "backfill_flow": S.BACKFILL,
    "fit_flow": S.FIT, "summarize_flow": S.SUMMARIZE, "rerank_flow": S.RERANK,
    "audit_flow": (*S.AUDIT, S.PROTECTED),
}  # fmt: skip


def test_every_deployments_options_are_settings_their_rules_accept():
    """deploy/prefect.yaml's options are named and valued by the settings' declarations."""
    import yaml

    deployments = yaml.safe_load((ROOT / "deploy" / "prefect.yaml").read_text())["deployments"]
    for d in deployments:
        flow = d["entrypoint"].rsplit(".", 1)[1]
        options = dict(d["parameters"].get("options", {}))
        options.pop("lock_timeout", None)
        declared = {s.name: s for s in FLOW_SETTINGS[flow]}
        assert set(options) <= set(declared), (d["name"], set(options) - set(declared))
        S.check_settings(d["name"], [declared[name] for name in options], options)
        assert S.LOCK_TIMEOUT.check(d["parameters"].get("options", {}).get("lock_timeout", 0),
                                    d["name"]) >= 0  # fmt: skip
