"""Opens a source's bytes, from a local file or from an object at a URL."""

from __future__ import annotations

from pathlib import Path

from fairpipe.datasets._remote import UrlPath, is_url, open_url

SourcePath = Path | UrlPath  # a local file or folder, or an object's URL
URL_UNREADABLE = "Source {url} cannot be read ({why})."


def _source_path(path: str) -> SourcePath:
    """A source's path as the readers take it: a URL named by its whole self."""
    return UrlPath(path) if is_url(path) else Path(path)


def open_binary(path):
    """A local file or a URL (:func:`fairpipe.datasets._remote.open_url`), opened to read bytes."""
    return open_url(str(path)) if is_url(str(path)) else open(path, "rb")
