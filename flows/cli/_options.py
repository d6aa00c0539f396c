"""The flag of a setting (:func:`setting_option`; :mod:`fairpipe.settings` declares each), the
annotation of ``--store`` (``store: Store``, in the commands' signatures), and the reading of
option values."""

from __future__ import annotations

import copy
import os
import stat
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from fairpipe import settings as S
from fairpipe.errors import FairpipeInputError
from fairpipe.number_text import DECIMAL_RULE, INTEGER_RULE, flaw, read_decimal, read_integer
from fairpipe.settings import REQUIRED, Setting
from fairpipe.validation import load_npy

if typing.TYPE_CHECKING:
    import numpy as np

Store = Annotated[str, typer.Option(S.STORE.flag, help=S.STORE.help, show_default=False)]


def choice(*values: str) -> dict:
    """The keywords of a ``typer.Option`` taking one of ``values``: the help lists them. The
    library checks the value (its one-line error names the parameter and the choices, before
    anything starts), not click, whose usage error would take several lines."""
    return {"metavar": "[" + "|".join(values) + "]"}


def setting_option(setting: Setting) -> Any:
    """The annotation of a setting's flag (:mod:`fairpipe.settings`): its type, flag and help, its
    choices, and its default as ``--help`` shows it."""
    kind = setting.kind if setting.default is not None else setting.kind | None
    choices = choice(*setting.rule.choices) if setting.rule and setting.rule.choices else {}
    shown = setting.default is not REQUIRED if setting.shown is None else setting.shown
    option = typer.Option(setting.flag, help=setting.help, show_default=shown, **choices)
    return Annotated[kind, option]  # type: ignore[valid-type]


MISSING_QUERY_FILE = "Query file {path!r} does not exist."
BAD_QUERY_FILE = "Query file {path!r} is not a .npy array (save the queries with numpy.save)."


ONE_QUERY = "Give exactly one of --query-id, --query-ids-file, --query-row or --query-file."


def given_queries(settings: dict) -> dict:
    """The queries of a command's ``--query-*`` options (:data:`fairpipe.settings.QUERIES`,
    popped from ``settings``), exactly one of them given: ``query_ids`` (an id, or the ids of a
    file in its order), ``query_rows`` or ``queries`` (the points of a .npy file)."""
    query_id, ids_file, query_row, query_file = (settings.pop(s.name) for s in S.QUERIES)
    if sum(x is not None for x in (query_id, ids_file, query_row, query_file)) != 1:
        raise FairpipeInputError(ONE_QUERY)
    if ids_file is not None:
        from fairpipe.datasets import read_ids

        query_id = read_ids(path=str(ids_file))
    return {"query_ids": query_id, "query_rows": query_row, "queries": read_query_file(query_file)}


def read_query_file(path: Path | None):
    """The points of a ``--query-file``, or None without one."""
    if path is None:
        return None
    if not path.exists():
        raise FairpipeInputError(MISSING_QUERY_FILE.format(path=str(path)))
    return load_npy(path, BAD_QUERY_FILE.format(path=str(path)))


# -- checks of option values, made before a command starts anything ------------------------------
EMPTY_STORE = "The --store option of {owner} must name a folder or a URL. Got an empty string."


def owner_of(command: str) -> str:
    """How messages name a command: ``fairpipe request-deletion``."""
    return "fairpipe " + command.replace("_", "-")


def check_store(store: str, owner: str) -> Path | None:
    """A store given: not an empty string (which would be the current folder), and a URL or a
    path that may name a store (:func:`fairpipe.storage.urls.parse_store_url`); its folder (None for a
    URL)."""
    if not str(store).strip():
        raise FairpipeInputError(EMPTY_STORE.format(owner=owner))
    from fairpipe.storage.urls import parse_store_url

    return parse_store_url(store).local_dir


ONE_SOURCE = "Give exactly one of --ids or --ids-file."


def check_ids_given(ids: str | None, ids_file: str | None, one_source: str = ONE_SOURCE,
                    required: bool = True) -> np.ndarray | None:  # fmt: skip
    """The ids of ``--ids`` or ``--ids-file``, read and checked (``one_source``: the error for
    both, or for neither where ``required``), or None. The command reads them again: a list of
    people to forget is small, and its errors then come before anything starts."""
    from fairpipe.datasets import read_ids

    given = (ids is not None) + (ids_file is not None)
    if given > 1 or (required and given == 0):
        raise FairpipeInputError(one_source)
    return read_ids(text=ids, path=ids_file) if given else None


# -- numbers typed as option values: the one rule of fairpipe.number_text --------------------------
NOT_TYPED_AS_RULED = "The {flag} option of {command} must be {what}. Got {value!r}: it {flaw}."


class OptionValueError(typer.BadParameter):
    """An option's value that breaks the rule of numbers: its message is the whole line."""

    def format_message(self) -> str:
        return self.message


def number_parser(kind: type, flag: str, owner: str) -> Callable[[Any], Any]:
    """The value of the ``int`` or ``float`` option ``flag`` of the command ``owner``, read by
    :mod:`fairpipe.number_text`'s rule (ASCII digits; click's own types read '５' and '1_0')."""

    def parse(value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return kind(value)  # a default
        text = str(value)
        got = read_integer(text) if kind is int else read_decimal(text)
        if got is None:
            what = f"an integer: {INTEGER_RULE}" if kind is int else DECIMAL_RULE
            raise OptionValueError(NOT_TYPED_AS_RULED.format(
                flag=flag, command=owner, what=what, value=text, flaw=flaw(text)))  # fmt: skip
        return got  # its range: the option's own check, which names what it is for

    parse.__name__ = kind.__name__  # the type's name in --help
    return parse


def typed_numbers(annotation: Any, owner: str) -> Any:
    """``annotation`` (of a command's parameter), or for an ``int`` or ``float`` option
    (``Annotated[int | None, typer.Option(...)]``) a copy whose values are read by
    :func:`number_parser`, unless it names a type of its own."""
    if typing.get_origin(annotation) is not Annotated:
        return annotation
    base, *extras = typing.get_args(annotation)
    kinds = [k for k in typing.get_args(base) or (base,) if k is not type(None)]
    if len(kinds) != 1 or kinds[0] not in (int, float):
        return annotation
    given = []
    for info in extras:
        if (
            isinstance(info, typer.models.OptionInfo)
            and info.click_type is None
            and (info.parser is None)
        ):
            info = copy.copy(info)  # an option shared by several commands: each its own
            # In an Annotated option, typer holds the first flag as its "default".
            flags = [info.default, *(info.param_decls or ())]
            flag = next((d for d in flags if isinstance(d, str) and d.startswith("--")), "value")
            info.parser = number_parser(kinds[0], flag, owner)
        given.append(info)
    return Annotated[(base, *given)]  # type: ignore[valid-type]


# The parameters naming a file (or a folder) a command reads, and how messages name them.
INPUT_OPTIONS = {"source": "SOURCE", "candidates": "CANDIDATES", "ids_file": "--ids-file",
                 "groups_file": "--groups-file", "query_file": "--query-file",
                 "bounds": "--bounds", "model": "--model", "dataset": "--dataset",
                 "data_dir": "--data-dir"}  # fmt: skip
SPECIAL_FILE = "{flag} {path} is {kind}, not a regular file: {why}. Give a regular file{folder}."
OUTPUT_OPTIONS = {"out": "--out", "plot": "--plot"}
_KINDS = {stat.S_IFIFO: "a named pipe (FIFO)", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}  # fmt: skip


def check_file_kinds(own: Mapping[str, Any]) -> None:
    """Refuse, before anything starts, a file a command reads or writes that is not a regular
    file or a folder: a named pipe waits for a writer (or a reader) forever, a device such as
    /dev/zero never ends; links are followed to what they name."""
    for name, flag in {**INPUT_OPTIONS, **OUTPUT_OPTIONS}.items():
        value = own.get(name)
        if not isinstance(value, (str, Path)) or not str(value) or "://" in str(value):
            continue
        text = str(value)
        # A named data set's path: 'adult:PATH', 'mnist:PATH'.
        head, colon, rest = text.partition(":")
        path = rest if colon and head.isidentifier() and not os.path.lexists(text) else text
        try:
            mode = os.stat(path).st_mode
        except (OSError, ValueError):
            continue  # absent or unreadable: the command's own message names it
        kind = _KINDS.get(stat.S_IFMT(mode))
        if kind is None:
            continue
        output = name in OUTPUT_OPTIONS
        if stat.S_ISFIFO(mode):
            why = "writing it waits for a reader" if output else "reading it waits for a writer"
        else:
            why = "what is written there is not kept" if output else "reading it never ends"
        folder = " or folder" if name in ("source", "data_dir", "out") else ""
        raise FairpipeInputError(SPECIAL_FILE.format(flag=flag, path=text, kind=kind, why=why,
                                                     folder=folder))  # fmt: skip
