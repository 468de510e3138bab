"""The destination breaker: pauses after runs of failures, held deliveries, 410 Gone."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise

from freezegun import freeze_time
from hypothesis import given
from hypothesis import strategies as st

from relay.delivery.breaker import (
    DestinationHealth,
    after_failure,
    after_gone,
    after_outcome,
    after_success,
    enabled,
    hold_until,
)
from relay.delivery.policies import BUILTIN_POLICIES, attempt_times

START = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
SMS = BUILTIN_POLICIES["platform-sms"]
TEN_MIN = timedelta(minutes=10)


def fail(health: DestinationHealth, times: int, now: datetime) -> DestinationHealth:
    for _ in range(times):
        health = after_failure(health, SMS, now)
    return health


def test_100_consecutive_failures_pause_10_minutes() -> None:
    with freeze_time(START) as clock:
        health = fail(DestinationHealth(), 99, START)
        assert health == DestinationHealth(consecutive_failures=99)
        assert hold_until(health, datetime.now(UTC)) is None

        clock.tick(5)
        health = after_failure(health, SMS, datetime.now(UTC))
        assert health.consecutive_failures == 100
        assert health.paused_until == START + timedelta(seconds=5) + TEN_MIN
        assert hold_until(health, datetime.now(UTC)) == health.paused_until

        clock.tick(TEN_MIN - timedelta(seconds=1))
        assert hold_until(health, datetime.now(UTC)) == health.paused_until
        clock.tick(1)
        assert hold_until(health, datetime.now(UTC)) is None  # the pause is over


def test_200_failures_pause_again_and_nothing_in_between() -> None:
    health = fail(DestinationHealth(), 100, START)
    first_pause = health.paused_until
    later = START + TEN_MIN
    health = fail(health, 99, later)
    assert health.consecutive_failures == 199 and health.paused_until == first_pause
    health = after_failure(health, SMS, later)
    assert health.consecutive_failures == 200
    assert health.paused_until == later + TEN_MIN


def test_a_success_resets_the_count_and_the_pause() -> None:
    health = fail(DestinationHealth(), 150, START)
    assert after_success(health) == DestinationHealth()
    health = fail(after_success(fail(DestinationHealth(), 99, START)), 99, START)
    assert health.consecutive_failures == 99 and health.paused_until is None


def test_policies_without_a_breaker_never_pause() -> None:
    health = DestinationHealth()
    for _ in range(1000):
        health = after_failure(health, BUILTIN_POLICIES["standard"], START)
    assert health == DestinationHealth(consecutive_failures=1000)


def test_held_deliveries_are_not_counted_as_failed() -> None:
    """During the pause a due delivery waits; the count goes on from 100 when the pause ends."""
    health = fail(DestinationHealth(), 100, START)
    with freeze_time(START + timedelta(seconds=10)) as clock:
        for _ in range(59):  # deliveries falling due every 10 s during the pause are held
            held = hold_until(health, datetime.now(UTC))
            assert held == START + TEN_MIN
            clock.tick(10)
        clock.move_to(START + TEN_MIN)
        assert hold_until(health, datetime.now(UTC)) is None
        health = after_failure(health, SMS, datetime.now(UTC))
    assert health.consecutive_failures == 101
    assert health.paused_until == START + TEN_MIN  # over: no new pause until the 200th failure


def test_the_schedule_waits_out_the_pause() -> None:
    times = list(attempt_times(SMS, START, succeed_at=250))
    gaps = [(b - a).total_seconds() for a, b in pairwise(times)]
    assert len(times) == 250
    assert gaps[99] == gaps[199] == 600  # after the 100th and the 200th failure
    assert {gap for i, gap in enumerate(gaps) if i not in (99, 199)} == {10}


def test_410_disables_until_an_operator_enables() -> None:
    health = after_gone(fail(DestinationHealth(), 3, START))
    assert health.disabled and health.consecutive_failures == 3
    assert after_failure(health, SMS, START).disabled
    assert after_success(health).disabled  # only an operator enables it again
    assert hold_until(health, START) is None  # disabled is signalled separately
    assert enabled(health) == DestinationHealth()
    assert not enabled(fail(after_gone(DestinationHealth()), 100, START)).paused_until


@dataclass(frozen=True)
class Seen:
    """An attempt's outcome as the breaker reads it."""

    ok: bool = False
    gone: bool = False
    down: bool = False


SUCCESS, DOWN, REFUSED, GONE = Seen(ok=True), Seen(down=True), Seen(), Seen(gone=True)


@dataclass(frozen=True)
class Pause:
    pause_after: int
    pause_for: timedelta


@given(
    outcomes=st.lists(st.sampled_from([SUCCESS, DOWN, REFUSED]), max_size=300),
    pause_after=st.integers(1, 40),
)
def test_the_count_is_the_downs_since_the_last_success_and_a_refusal_changes_nothing(
    outcomes: list[Seen], pause_after: int
) -> None:
    rule = Pause(pause_after, TEN_MIN)
    health, downs, paused_until = DestinationHealth(), 0, None
    for second, outcome in enumerate(outcomes):
        now = START + timedelta(seconds=second)
        before = health
        health = after_outcome(health, outcome, rule, now)
        if outcome == REFUSED:
            assert health == before  # neither counted nor reset
            continue
        if outcome == SUCCESS:
            downs, paused_until = 0, None
        else:
            downs += 1
            if downs % pause_after == 0:
                paused_until = now + TEN_MIN
        assert health == DestinationHealth(downs, paused_until)


def test_refusals_never_pause_however_many_and_downs_still_do() -> None:
    """The attack: any number of messages refused one by one leave the breaker closed; a run of
    downs pauses even with refusals in between."""
    health = DestinationHealth()
    for second in range(10_000):
        health = after_outcome(health, REFUSED, SMS, START + timedelta(seconds=second))
    assert health == DestinationHealth()
    for _ in range(99):
        health = after_outcome(health, DOWN, SMS, START)
        health = after_outcome(health, REFUSED, SMS, START)
    assert health.paused_until is None
    health = after_outcome(health, DOWN, SMS, START)
    assert health == DestinationHealth(100, START + TEN_MIN)


def test_410_keeps_its_own_rule_and_a_success_still_resets() -> None:
    failing = fail(DestinationHealth(), 3, START)
    assert after_outcome(failing, GONE, SMS, START) == after_gone(failing)
    assert after_outcome(failing, SUCCESS, SMS, START) == DestinationHealth()
