"""Keys: every name is distinct per namespace and per id (no processes)."""

from __future__ import annotations

import pytest

from rtml.control_plane import Keys


def _all_names(keys: Keys, ident: str) -> list[str]:
    return [keys.node(ident), keys.job(ident), keys.function(ident),
            keys.object(ident), keys.actor(ident), keys.named_actor("ns", ident),
            keys.submission(ident), keys.nodes, keys.jobs, keys.tasks, keys.objects,
            keys.actors, keys.events, keys.pending_demand, keys.submissions,
            keys.dashboard]


def test_default_namespace_is_rtml() -> None:
    assert Keys().namespace == "rtml"
    assert Keys().node("ab") == "rtml:node:ab"


def test_every_kind_of_key_is_distinct() -> None:
    names = _all_names(Keys(), "00ff")
    assert len(set(names)) == len(names)


def test_namespaces_do_not_share_any_key() -> None:
    a, b = set(_all_names(Keys("alpha"), "01")), set(_all_names(Keys("beta"), "01"))
    assert not a & b
    assert all(name.startswith("alpha:") for name in a)


def test_ids_do_not_share_any_key() -> None:
    one, two = _all_names(Keys(), "01"), _all_names(Keys(), "02")
    per_id = [n for n, m in zip(one, two, strict=True) if n != m]
    assert len(per_id) == 7
    assert not set(per_id) & set(two)


def test_named_actor_key_separates_namespace_from_name() -> None:
    keys = Keys()
    assert keys.named_actor("a:b", "c") != keys.named_actor("a", "b:c")
    assert keys.named_actor("ns", "x") != keys.named_actor("other", "x")


@pytest.mark.parametrize("bad", ["", "a:b", "a b", "tab\t"])
def test_bad_namespace_is_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        Keys(bad)
