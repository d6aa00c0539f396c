"""Map a store URL to an Icechunk storage: a local folder by default, object stores by URL.

Accepted forms: ``PATH`` or ``file://PATH`` (local folder), ``memory://NAME`` (in-process, for
tests), ``s3://BUCKET/PREFIX``, ``gs://BUCKET/PREFIX`` (or ``gcs://``), ``az://ACCOUNT/CONTAINER/PREFIX``,
``r2://BUCKET/PREFIX`` and ``tigris://BUCKET/PREFIX``. Object-store credentials come from the
environment (Icechunk's ``from_env``). An S3-compatible server other than AWS (MinIO, Ceph, moto)
is named by ``AWS_ENDPOINT_URL`` (path-style requests; plain http allowed when the URL says so).
"""

from __future__ import annotations

import itertools
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from fairpipe.datasets import object_store as remote_store
from fairpipe.datasets import s3_endpoint
from fairpipe.errors import FairpipeInputError
from fairpipe.storage.paths import store_folder

OBJECT_SCHEMES = ("s3", "gs", "gcs", "az", "r2", "tigris")


@dataclass
class StorageSpec:
    scheme: str  # file | memory | s3 | gcs | azure | r2 | tigris
    local_dir: Path | None = None
    kwargs: dict = field(default_factory=dict)


def parse_store_url(url: str) -> StorageSpec:
    """Parse without touching any storage.

    >>> parse_store_url("s3://my-bucket/people/adult").kwargs
    {'bucket': 'my-bucket', 'prefix': 'people/adult', 'from_env': True}
    >>> parse_store_url("az://acct/container/x").kwargs["container"]
    'container'
    """
    parsed = urlparse(str(url))
    scheme = parsed.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and str(url)[1:3] == ":\\"):
        path = parsed.path if scheme == "file" else str(url)
        return StorageSpec("file", local_dir=store_folder(path))
    if scheme == "memory":
        return StorageSpec("memory", kwargs={})
    if scheme not in OBJECT_SCHEMES:
        raise FairpipeInputError(
            f"Store URL {url!r} has an unknown scheme {scheme!r}; use a folder path, file://, "
            f"memory://, or one of {', '.join(s + '://' for s in OBJECT_SCHEMES)}."
        )
    if not parsed.netloc:
        raise FairpipeInputError(f"Store URL {url!r} names no bucket or account.")
    prefix = parsed.path.strip("/")
    if scheme == "az":
        container, _, rest = prefix.partition("/")
        if not container:
            raise FairpipeInputError(f"Store URL {url!r}: use az://ACCOUNT/CONTAINER/PREFIX.")
        return StorageSpec(
            "azure",
            kwargs={
                "account": parsed.netloc,
                "container": container,
                "prefix": rest,
                "from_env": True,
            },
        )
    name = {"gs": "gcs"}.get(scheme, scheme)
    return StorageSpec(name, kwargs={"bucket": parsed.netloc, "prefix": prefix, "from_env": True})


_MEMORY: dict[str, object] = {}


def object_store(spec: StorageSpec, *under: str, endpoint: str | None = None):
    """An obstore store rooted at the store's prefix (joined with ``under``), for the objects
    Icechunk does not manage (the deletion queue, an ingest's staging area) or that a failed
    creation leaves; None for a local folder, memory://, r2:// and tigris://. Its settings are the environment's,
    as Icechunk's (:func:`fairpipe.datasets._remote.object_store`; ``endpoint``: an S3
    endpoint to use instead of the environment's)."""
    if spec.scheme not in ("s3", "gcs", "azure"):
        return None
    k = spec.kwargs
    prefix = "/".join(p for p in (k.get("prefix", ""), *under) if p)
    if spec.scheme == "azure":
        return remote_store("azure", k["container"], prefix, account=k["account"])
    return remote_store(spec.scheme, k["bucket"], prefix, endpoint=endpoint)


def list_objects(url: str, spec: StorageSpec) -> set[str]:
    """The objects under an object store URL's prefix (none for memory:// stores)."""
    store = object_store(spec)
    if store is None:
        return set()
    import obstore

    return {m["path"] for batch in obstore.list(store) for m in batch}


def delete_objects(url: str, spec: StorageSpec, names) -> None:
    """Delete objects under an object store URL's prefix (a memory:// store: all of it)."""
    if spec.scheme == "memory":
        _MEMORY.pop(url, None)
        return
    store = object_store(spec)
    names = sorted(names)
    if store is None or not names:
        return
    import obstore

    obstore.delete(store, names)


def enclosing_repository_url(url: str, spec: StorageSpec) -> str | None:
    """The URL of the store whose prefix holds the object-store URL ``url``'s (an ancestor
    prefix with a repository's ``refs/`` objects), or None: a store is never made inside
    another (:mod:`fairpipe.storage.paths` says why). One listing request per ancestor prefix."""
    store = object_store(StorageSpec(spec.scheme, kwargs={**spec.kwargs, "prefix": ""}))
    if store is None:
        return None
    import obstore

    parts = [p for p in spec.kwargs.get("prefix", "").split("/") if p]
    for depth in range(len(parts)):
        above = "/".join(parts[:depth])
        listed = obstore.list(store, prefix="/".join(p for p in (above, "refs/") if p),
                              chunk_size=1)  # fmt: skip
        if any(batch for batch in itertools.islice(listed, 1)):
            base = url.rstrip("/")
            base = base[: len(base) - len("/".join(parts))].rstrip("/")
            return f"{base}/{above}" if above else base
    return None


PROBE_SECONDS = 5.0
_ANSWERED: set[str] = set()  # endpoints that answered this process's probe (probed once)


def probe_endpoint(spec: StorageSpec) -> str | None:
    """Why the store's own S3 endpoint cannot be reached, or None: one TCP connection, so a
    server that is down or a wrong port is reported in at most PROBE_SECONDS (the S3 client
    would retry for about 15 s first), once per process for an endpoint that answers (a
    command opens its store several times). Public endpoints are not probed."""
    endpoint = s3_endpoint()
    if spec.scheme != "s3" or endpoint is None or endpoint in _ANSWERED:
        return None
    parts = urlparse(endpoint)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return f"the endpoint {endpoint} has no valid port"
    if not parts.hostname:
        return f"the endpoint {endpoint} names no host"
    try:
        socket.create_connection((parts.hostname, port), timeout=PROBE_SECONDS).close()
    except OSError as e:
        return f"no server answers at {endpoint}: {e.strerror or type(e).__name__}"
    _ANSWERED.add(endpoint)
    return None


def make_storage(url: str, spec: StorageSpec):
    import icechunk

    if spec.scheme == "file":
        assert spec.local_dir is not None
        return icechunk.local_filesystem_storage(str(spec.local_dir))
    if spec.scheme == "memory":
        # One in-memory storage per URL per process, so reopening sees earlier commits.
        if url not in _MEMORY:
            _MEMORY[url] = icechunk.in_memory_storage()
        return _MEMORY[url]
    factory = getattr(icechunk, f"{spec.scheme}_storage")
    kwargs = dict(spec.kwargs)
    endpoint = s3_endpoint()
    if spec.scheme == "s3" and endpoint:
        kwargs.update(endpoint_url=endpoint, allow_http=endpoint.startswith("http://"),
                      force_path_style=True,
                      region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"))  # fmt: skip
    return factory(**kwargs)
