"""The older attribute names of each place of a store, read as the library's names
(fairpipe.storage.names); a store holding them, read and upgraded by the flows:
tests/flows/test_old_names_upgrade.py."""

from fairpipe.storage.names import renamed


def test_the_old_names_of_each_place():
    assert renamed({"gamma": 0.2, "iterations": 5, "epsilon": 0.1}, "qkmeans") == {
        "balance": 0.2, "max_iter": 5, "epsilon": 0.1}  # fmt: skip
    # The summary's gamma is the facility-location coefficient: not renamed.
    assert renamed({"gamma": 0.5, "width": 4}, "summary") == {"gamma": 0.5, "fanout": 4}
    current = {"n_hashes": 3, "n_tables": 4}
    assert renamed(current, "lsh") is current
