"""The split of a line's test files between sessions side by side (tests/sharding.py)."""

from __future__ import annotations

import pytest

from tests import sharding


def test_every_file_goes_to_exactly_one_session_heaviest_first_to_the_lightest() -> None:
    weights = {"a.py": 90.0, "b.py": 60.0, "c.py": 50.0, "d.py": 20.0, "e.py": 20.0, "f.py": 1.0}
    groups = sharding.deal(weights, 2)
    assert set().union(*groups) == set(weights)
    assert not groups[0] & groups[1]
    assert groups == [{"a.py", "d.py", "e.py"}, {"b.py", "c.py", "f.py"}]  # 130 and 111
    assert sharding.deal(weights, 2) == groups, "every session deals the same way"
    assert sharding.deal(weights, 1) == [set(weights)]


def test_more_sessions_than_files_leaves_some_empty() -> None:
    assert sharding.deal({"a.py": 1.0}, 3) == [{"a.py"}, set(), set()]


@pytest.mark.parametrize("spec", ["2", "0/2", "3/2", "a/b", "1/2/3"])
def test_a_bad_shard_says_what_is_wrong(spec: str) -> None:
    with pytest.raises(pytest.UsageError, match="CRON_TEST_SHARD"):
        sharding.shard_of(spec)


def test_a_good_shard_is_read() -> None:
    assert sharding.shard_of("2/3") == (2, 3)


def test_the_fault_scenarios_and_the_models_are_dealt_between_the_lines_and_the_rest_runs_on_each() -> None:
    weights = {"tests/faults/test_a.py": 90.0, "tests/faults/test_b.py": 60.0, "tests/model/test_m.py": 50.0,
               "tests/test_x.py": 20.0, "tests/browser/test_y.py": 5.0}
    first, second = (sharding.this_line(weights, f"{k}/2") for k in (1, 2))
    everywhere = {"tests/test_x.py", "tests/browser/test_y.py"}
    assert first & second == everywhere
    assert first | second == set(weights)
    assert first - everywhere == {"tests/faults/test_a.py"}  # 90 against 60 + 50
    assert sharding.this_line(weights, "1/1") == set(weights)
    with pytest.raises(pytest.UsageError, match="CRON_TEST_LINE"):
        sharding.this_line(weights, "3/2")


def test_a_file_with_no_recorded_seconds_is_dealt_alike_however_many_tests_a_line_collects() -> None:
    recorded = {"tests/faults/test_a.py": 30.0, "tests/faults/test_b.py": 20.0}
    one = {**recorded, "tests/faults/test_new.py": 4 * sharding.UNKNOWN_TEST_SECONDS}
    other = {**recorded, "tests/faults/test_new.py": 400 * sharding.UNKNOWN_TEST_SECONDS}
    for k in (1, 2):
        assert sharding.this_line(one, f"{k}/2", recorded) == sharding.this_line(other, f"{k}/2", recorded)
