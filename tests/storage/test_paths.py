"""fairpipe.storage.paths: the one place a local store path is resolved and checked. Each refusal names
the path and writes nothing; what is accepted is the folder os.path.realpath gives (the
reference)."""

import os

import pytest

from fairpipe.errors import FairpipeInputError
from fairpipe.storage.paths import check_own_objects, own_folder, store_folder


def tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def a_repository(folder):
    for name in ("refs", "snapshots", "chunks"):
        (folder / name).mkdir(parents=True)
    return folder


def test_a_plain_path_and_links_to_folders_resolve_as_realpath_does(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    for given in ("real/store", "link/store", str(tmp_path / "link"), "./link/../real/x"):
        assert store_folder(given) == type(tmp_path)(os.path.realpath(tmp_path / given))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert store_folder("~/link/s") == tmp_path / "real" / "s"


@pytest.mark.parametrize("inner", ["inner", "chunks/x", "queue", "refs/a/b"])
def test_a_path_inside_a_store_is_refused_but_the_store_itself_is_not(tmp_path, inner):
    outer = a_repository(tmp_path / "outer")
    before = tree(tmp_path)
    with pytest.raises(FairpipeInputError, match=f"is inside the store {outer};"):
        store_folder(str(outer / inner))
    assert store_folder(str(outer)) == outer
    assert tree(tmp_path) == before


def test_a_link_into_a_store_is_inside_it(tmp_path):
    outer = a_repository(tmp_path / "outer")
    (tmp_path / "looks-outside").symlink_to(outer / "chunks")
    with pytest.raises(FairpipeInputError, match="is inside the store"):
        store_folder(str(tmp_path / "looks-outside" / "s"))


def test_a_dangling_link_and_a_loop_are_refused_and_nothing_is_made(tmp_path):
    (tmp_path / "dangling").symlink_to(tmp_path / "elsewhere" / "target")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    before = tree(tmp_path)
    with pytest.raises(FairpipeInputError, match=r"symbolic link .*dangling, which names nothing"):
        store_folder(str(tmp_path / "dangling"))
    with pytest.raises(FairpipeInputError, match="names nothing"):
        store_folder(str(tmp_path / "dangling" / "below"))
    for given in (tmp_path / "a", tmp_path / "a" / "store"):
        with pytest.raises(FairpipeInputError, match="loop of symbolic links"):
            store_folder(str(given))
    assert tree(tmp_path) == before and not (tmp_path / "elsewhere").exists()


def test_names_and_paths_past_the_filesystems_limits_are_refused(tmp_path):
    assert store_folder(str(tmp_path / ("n" * 255))) == tmp_path / ("n" * 255)
    with pytest.raises(FairpipeInputError, match="has a name of 256 bytes"):
        store_folder(str(tmp_path / ("n" * 256) / "store"))
    with pytest.raises(FairpipeInputError, match="has a name of 258 bytes"):
        store_folder(str(tmp_path / ("é" * 129)))  # 129 characters, 258 bytes
    deep = tmp_path.joinpath(*["d" * 200] * 21)
    with pytest.raises(FairpipeInputError, match=r"bytes long; a path holds at most 4095 bytes"):
        store_folder(str(deep))
    assert tree(tmp_path) == []


def test_a_stores_own_folders_are_never_links_or_files(tmp_path):
    assert own_folder(tmp_path / "queue", "requests") == tmp_path / "queue"  # absent: to be made
    (tmp_path / "queue").mkdir()
    assert own_folder(tmp_path / "queue", "requests") == tmp_path / "queue"
    (tmp_path / "outside").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "outside")
    with pytest.raises(FairpipeInputError, match=r"is a symbolic link \(to .*outside\)"):
        own_folder(tmp_path / "linked", "requests")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FairpipeInputError, match="is not a folder: fairpipe keeps requests"):
        own_folder(tmp_path / "file", "requests")


def test_garbage_collection_is_refused_over_a_folder_among_the_objects(tmp_path):
    store = a_repository(tmp_path / "store")
    (store / "chunks" / "ABC").write_bytes(b"object")
    check_own_objects(store, str(store))  # files only: the store's own
    (store / "chunks" / "inner").mkdir()
    with pytest.raises(FairpipeInputError, match=r"holds the folder chunks/inner"):
        check_own_objects(store, str(store))
