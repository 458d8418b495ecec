"""The load balancer and the cluster view (pure): random, p2c, key (rendezvous hashing)."""

from __future__ import annotations

import collections
import random

import pytest
from tests.chisquare import chi_square_uniform_p

from kapok.client.balance import make_balancer
from kapok.client.view import Member, by_pair, members_from_nodes, members_from_registry

PAIRS = ["m1", "m2", "m3", "m4", "m5"]
KEYS = [f"customer-{i}" for i in range(10_000)]


def _placement(pairs: list[str], seed: int = 0) -> dict[str, str]:
    pick = make_balancer("key", random.Random(seed))
    return {key: pick(pairs, key, {}) for key in KEYS}


def test_chi_square_helper_matches_known_values() -> None:
    assert chi_square_uniform_p([100, 100, 100]) == pytest.approx(1.0)
    # x = 2·(10²/100)… for (110, 90, 100): x = 2, df = 2 -> exp(-1)
    assert chi_square_uniform_p([110, 90, 100]) == pytest.approx(0.36788, rel=1e-4)
    assert chi_square_uniform_p([300, 0, 0]) < 1e-100


def test_key_mode_sends_one_key_to_one_pair_whatever_the_producer() -> None:
    a, b = _placement(PAIRS, seed=1), _placement(PAIRS, seed=2)
    assert a == b  # no randomness, no per-process hash salt: every producer agrees
    pick = make_balancer("key", random.Random(3))
    assert {pick(list(reversed(PAIRS)), "customer-7", {}) for _ in range(50)} == {a["customer-7"]}


def test_key_mode_spreads_keys_near_uniformly() -> None:
    counts = collections.Counter(_placement(PAIRS).values())
    assert set(counts) == set(PAIRS)
    assert chi_square_uniform_p([counts[p] for p in PAIRS]) > 0.001, counts


def test_key_mode_moves_only_the_keys_of_a_pair_that_leaves() -> None:
    before = _placement(PAIRS)
    after = _placement([p for p in PAIRS if p != "m3"])
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved == {k for k in KEYS if before[k] == "m3"}
    assert 1500 < len(moved) < 2500  # about a fifth
    # ... and they spread over the remaining pairs instead of piling onto one
    assert len({after[k] for k in moved}) == 4


def test_key_mode_a_joining_pair_takes_only_keys_it_wins() -> None:
    before = _placement(PAIRS)
    after = _placement([*PAIRS, "m6"])
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved and all(after[k] == "m6" for k in moved)


def test_key_mode_places_messages_without_a_key_at_random() -> None:
    pick = make_balancer("key", random.Random(4))
    assert len({pick(PAIRS, "", {}) for _ in range(200)}) == len(PAIRS)


def test_random_mode_is_uniform() -> None:
    pick = make_balancer("random", random.Random(5))
    counts = collections.Counter(pick(PAIRS, "same-key", {}) for _ in range(20_000))
    assert chi_square_uniform_p([counts[p] for p in PAIRS]) > 0.001, counts


def test_p2c_prefers_the_lower_load_of_two() -> None:
    pick = make_balancer("p2c", random.Random(6))
    loads = {"m1": 0.0, "m2": 50.0, "m3": 100.0}
    counts = collections.Counter(pick(["m1", "m2", "m3"], "", loads) for _ in range(9_000))
    # m1 wins whenever it is drawn (2 of 3 pairs), m3 never; m2 wins the (m2, m3) draws.
    assert counts["m3"] == 0
    assert 5_700 < counts["m1"] < 6_300 and 2_700 < counts["m2"] < 3_300
    assert pick(["m2"], "", loads) == "m2"


def test_unknown_balance_is_refused() -> None:
    with pytest.raises(ValueError, match="balance"):
        make_balancer("round-robin", random.Random())


# ---------------------------------------------------------------- the view


def _row(name: str, **fields: object) -> dict[str, object]:
    row: dict[str, object] = {
        "name": name, "http_url": f"http://127.0.0.1:{8000 + len(name)}/", "state": "alive", "role": "master",
        "active": True, "pair": None, "epoch": 0, "load": 1.5,
    }  # fmt: skip
    row.update(fields)
    return row


def test_view_keeps_live_active_members_and_groups_them_by_pair() -> None:
    rows = [
        _row("m1", pair="s1"),
        _row("s1", role="slave", active=False, pair="m1"),  # a passive slave takes no clients
        _row("m2", state="suspect"),  # may still refute: kept
        _row("m3", state="dead"),
        _row("m4", state="left"),
        _row("m5", http_url=""),  # malformed rows are skipped, not fatal
        "not a row",
    ]
    members = members_from_nodes(rows)
    assert [m.name for m in members] == ["m1", "m2"]
    assert members[0].url == "http://127.0.0.1:8002" and members[0].ws_url == "ws://127.0.0.1:8002"
    assert set(by_pair(members)) == {"m1", "m2"}


def test_a_slave_that_took_over_serves_its_masters_pair() -> None:
    rows = [_row("m1", state="dead", pair="s1"), _row("s1", role="slave", active=True, pair="m1", epoch=2)]
    view = by_pair(members_from_nodes(rows))
    assert list(view) == ["m1"] and view["m1"].name == "s1" and view["m1"].epoch == 2
    # While the old master still claims to be active too, the higher epoch wins.
    rows[0]["state"] = "alive"
    view = by_pair(members_from_nodes(rows))
    assert view["m1"].name == "s1"


def test_the_pair_id_keeps_a_pair_whole_whatever_its_roles_now() -> None:
    # As a node reports them: once the slave has taken over, it is the pair's master
    # (role "master"), and every row names the pair by its configured master (pair_id).
    rows = [
        _row("m1", state="dead", pair="s1", pair_id="m1"),
        _row("s1", role="master", active=True, pair="m1", epoch=2, pair_id="m1"),
        _row("m2", pair_id="m2"),
    ]
    view = by_pair(members_from_nodes(rows))
    assert sorted(view) == ["m1", "m2"] and view["m1"].name == "s1"


def test_rows_without_the_active_field_count_masters_as_active() -> None:
    rows = [_row("m1"), _row("s1", role="slave", pair="m1")]
    for row in rows:
        del row["active"]
    assert [m.name for m in members_from_nodes(rows)] == ["m1"]


def test_registry_rows_become_members() -> None:
    rows = [{"Name": "mq:127.0.0.1:8011", "Addr": "127.0.0.1", "Port": "8011"}, {"Name": "bad"}]
    assert members_from_registry(rows) == [
        Member("127.0.0.1:8011", "http://127.0.0.1:8011", "127.0.0.1:8011")
    ]
