"""Objects at a URL (``s3://``, ``gs://``, ``az://``, ``https://``), read through obstore with the
credential settings of the environment, the same settings a store at such a URL is opened with
(:mod:`fairpipe.storage.urls` builds its object stores here).

An S3-compatible server other than AWS (MinIO, Ceph, moto) is named by ``AWS_ENDPOINT_URL``
(``AWS_ENDPOINT_URL_S3`` first): path-style requests, plain http allowed where the endpoint says
so. Credentials come from the usual variables (``AWS_ACCESS_KEY_ID``..., ``GOOGLE_*``,
``AZURE_STORAGE_*``) of the process that reads, so a Dask worker reading a source needs them in
its own environment, as it does to write the store.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlparse

# Source URL schemes (``http://`` too, for a server on a private network).
URL_SCHEMES = ("s3", "gs", "gcs", "az", "https", "http")
# Bytes a URL file is read ahead by (a request per read otherwise: pandas reads 256 KB at a time).
READ_AHEAD = 8 << 20


def is_url(source: str) -> bool:
    """Whether ``source`` names an object by URL (not a local path or a built-in data set).

    >>> is_url("s3://bucket/people.parquet"), is_url("people.parquet"), is_url("mnist:x.csv")
    (True, False, False)
    """
    scheme, sep, _ = str(source).partition("://")
    return bool(sep) and scheme.lower() in URL_SCHEMES


class UrlPath(str):
    """A source's URL where the table readers take a path: its ``name`` (what error messages
    call the source) is the whole URL; ``suffix`` and ``suffixes`` are its path's.

    >>> UrlPath("s3://bucket/people.csv.gz").suffixes
    ['.csv', '.gz']
    """

    @property
    def name(self) -> str:
        return str(self)

    @property
    def suffix(self) -> str:
        return PurePosixPath(urlparse(self).path).suffix

    @property
    def suffixes(self) -> list[str]:
        return PurePosixPath(urlparse(self).path).suffixes


def s3_endpoint() -> str | None:
    """The S3-compatible server named in the environment (MinIO, moto, Ceph...), if any."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def object_store(scheme: str, bucket: str, prefix: str = "", account: str | None = None,
                 endpoint: str | None = None):  # fmt: skip
    """An obstore store of ``bucket`` (an Azure container of ``account``) rooted at ``prefix``.
    ``scheme``: s3, gcs or azure, or r2 and tigris (S3-compatible: their endpoint named by
    ``endpoint`` or the environment). ``endpoint``: an S3 endpoint to use rather than the
    environment's (a store's staging area keeps the one its client opened the store with)."""
    from obstore.store import AzureStore, GCSStore, S3Store

    prefix = prefix.strip("/") or None  # type: ignore[assignment]
    if scheme in ("s3", "r2", "tigris"):
        endpoint = endpoint or s3_endpoint()
        if endpoint is None and scheme == "tigris":
            endpoint = "https://fly.storage.tigris.dev"
        if endpoint is None and scheme == "r2":
            raise ValueError("an r2:// store's endpoint is named by AWS_ENDPOINT_URL")
        options: Any = {"allow_http": bool(endpoint and endpoint.startswith("http://"))}
        if endpoint is None:
            return S3Store(bucket, prefix=prefix, client_options=options)
        return S3Store(bucket, prefix=prefix, client_options=options, endpoint=endpoint,
                       virtual_hosted_style_request=False)  # fmt: skip
    if scheme == "gcs":
        return GCSStore(bucket, prefix=prefix)
    if scheme == "azure":
        return AzureStore(bucket, prefix=prefix, account_name=account)
    raise ValueError(f"no object store for the scheme {scheme!r}")


def url_location(url: str):
    """(An obstore store, the object's path in it) for an object URL; a path ending in ``/``
    names a prefix (its path then ends in ``/`` too, or is empty)."""
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    path = parsed.path.lstrip("/")
    if scheme in ("http", "https"):
        from obstore.store import HTTPStore

        options: Any = {"allow_http": scheme == "http"}
        return HTTPStore(f"{scheme}://{parsed.netloc}", client_options=options), path
    if scheme == "az":
        container, _, rest = path.partition("/")
        return object_store("azure", container, account=parsed.netloc), rest
    return object_store({"gs": "gcs"}.get(scheme, scheme), parsed.netloc), path


class UrlUnreadable(OSError):
    """An object that cannot be read from here: not found, refused, not reachable (its message
    is obstore's first line). The table readers let it through, so that it is reported as the
    URL that cannot be read (by the client, or by the worker named), not as a bad file."""


class UrlMissing(UrlUnreadable, FileNotFoundError):
    """No object at the URL."""


@contextlib.contextmanager
def _os_errors():
    """obstore's errors as :class:`UrlUnreadable` (:class:`UrlMissing`, a FileNotFoundError,
    where there is no object)."""
    from obstore.exceptions import BaseError

    try:
        yield
    except FileNotFoundError as why:
        raise UrlMissing(_first(why)) from None
    except (OSError, BaseError) as why:
        raise UrlUnreadable(_first(why)) from None


def _first(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def url_size(url: str) -> int:
    """The size in bytes of the object at ``url`` (FileNotFoundError where there is none; another
    OSError where it cannot be asked for)."""
    import obstore

    store, path = url_location(url)
    with _os_errors():
        return int(obstore.head(store, path)["size"])


def list_url(url: str) -> list[tuple[str, int]]:
    """(URL, size) of every object under the prefix ``url``, sorted by name."""
    import obstore

    store, path = url_location(url)
    prefix = path.rstrip("/")
    found = []
    with _os_errors():
        for batch in obstore.list(store, prefix=prefix or None):
            for meta in batch:
                found.append((meta["path"], int(meta["size"])))
    base = url[: len(url) - len(path)] if path else url.rstrip("/") + "/"
    return sorted((base + name, size) for name, size in found)


def open_url(url: str, size: int | None = None) -> io.BufferedReader:
    """The object at ``url`` as a seekable binary file, read ``READ_AHEAD`` bytes per request."""
    store, path = url_location(url)
    return io.BufferedReader(_UrlFile(store, path, size), buffer_size=READ_AHEAD)


class _UrlFile(io.RawIOBase):
    """An object read by ranges (obstore's ``get_range``): what pandas and pyarrow read from."""

    def __init__(self, store, path: str, size: int | None = None):
        import obstore

        self._store, self._path, self._pos = store, path, 0
        with _os_errors():
            self._size = int(obstore.head(store, path)["size"]) if size is None else size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        import obstore

        end = min(self._pos + len(buffer), self._size)
        if end <= self._pos:
            return 0
        with _os_errors():
            data = obstore.get_range(self._store, self._path, start=self._pos, end=end)
        n = len(data)
        memoryview(buffer).cast("B")[:n] = memoryview(data)
        self._pos += n
        return n
