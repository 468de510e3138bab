"""Retry policies: the exact attempt times of every built-in policy, custom ones, jitter, bounds."""

from __future__ import annotations

import random
import tomllib
from datetime import UTC, datetime, timedelta
from itertools import islice, pairwise

import pytest
from freezegun import freeze_time
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from relay.delivery.breaker import DestinationHealth, after_failure, hold_until
from relay.delivery.policies import (
    BUILTIN_POLICIES,
    DelaysPolicy,
    ExponentialPolicy,
    Policy,
    PolicyConfig,
    PolicyConfigs,
    attempt_times,
    resolve_policies,
    retry_after_bounded,
)

START = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)
M = timedelta(minutes=1)
H = timedelta(hours=1)
CONFIGS = TypeAdapter(PolicyConfigs)


def offsets(times: list[datetime], unit: timedelta = S) -> list[float]:
    return [(t - START) / unit for t in times]


def walk_on_the_clock(policy: Policy) -> list[datetime]:
    """Play the relay on a frozen clock: every attempt fails; held deliveries are not counted."""
    times: list[datetime] = []
    health = DestinationHealth()
    with freeze_time(START) as clock:
        first = datetime.now(UTC)
        deadline = policy.deadline(first)
        while True:
            now = datetime.now(UTC)
            held = hold_until(health, now)
            if held is not None:  # not attempted, not counted
                if deadline is not None and held > deadline:
                    return times
                clock.move_to(held)
                continue
            times.append(now)
            health = after_failure(health, policy, now)
            next_time = policy.next_attempt(len(times), first, now)
            if next_time is None:
                return times
            clock.move_to(next_time)


# --- the built-in policies ------------------------------------------------------------------------


def test_the_builtin_policies_are_exactly_these() -> None:
    assert set(BUILTIN_POLICIES) == {
        "platform-sms",
        "platform-numinfo",
        "platform-status",
        "platform-appa",
        "standard",
    }
    assert all(policy.jitter == 0 for policy in BUILTIN_POLICIES.values())


@pytest.mark.parametrize("name", sorted(BUILTIN_POLICIES))
def test_walking_the_clock_matches_attempt_times(name: str) -> None:
    policy = BUILTIN_POLICIES[name]
    assert walk_on_the_clock(policy) == list(attempt_times(policy, START))


def test_platform_sms_every_10s_pausing_10min_after_every_100_failures_for_48h() -> None:
    policy = BUILTIN_POLICIES["platform-sms"]
    times = offsets(list(attempt_times(policy, START)))
    assert times[:100] == [10 * n for n in range(100)]
    assert times[100] == 990 + 600  # the 101st attempt waits out the 10 min pause
    assert times[100:200] == [1590 + 10 * n for n in range(100)]
    assert times[200] == 2580 + 600
    # cycles of 100 attempts over 990 s plus a 600 s pause; 109 of them fit in 48 h
    assert times == [1590 * cycle + 10 * n for cycle in range(109) for n in range(100)]
    assert len(times) == 10_900
    assert times[-1] == 172_710  # 47:58:30; after the 109th pause it would be 173,310 > 172,800
    assert policy.pause_after == 100 and policy.pause_for == 10 * M
    assert policy.answer_budget is None and policy.is_success(204)


def test_platform_sms_without_the_breaker_is_every_10s_up_to_48h_inclusive() -> None:
    policy = BUILTIN_POLICIES["platform-sms"]
    times = offsets(list(attempt_times(policy, START, breaker=False)))
    assert times == [10 * n for n in range(17_281)]  # 0 s ... 172,800 s = 48 h, 17,281 attempts
    assert policy.next_attempt(17_281, START, START + 48 * H) is None
    assert policy.next_attempt(3, START, START + 48 * H - 5 * S) is None  # would be 48 h + 5 s


def test_platform_numinfo_1_5_10_20_30_60_min_apart_then_hourly_for_48h() -> None:
    policy = BUILTIN_POLICIES["platform-numinfo"]
    minutes = offsets(list(attempt_times(policy, START)), M)
    assert minutes == [0, 1, 6, 16, 36, 66, *range(126, 2827, 60)]
    assert minutes[:9] == [0, 1, 6, 16, 36, 66, 126, 186, 246]
    assert len(minutes) == 52 and minutes[-1] == 2826  # 47 h 06 min; 2886 min > 48 h
    assert policy.next_attempt(52, START, START + 2826 * M) is None
    assert policy.answer_budget == 2 * S
    assert policy.is_success(200)
    assert not any(policy.is_success(code) for code in (201, 202, 204, 301, 404, 500))


def test_platform_status_three_attempts_in_all() -> None:
    policy = BUILTIN_POLICIES["platform-status"]
    assert offsets(list(attempt_times(policy, START))) == [0, 30, 150]
    assert policy.next_attempt(3, START, START + 150 * S) is None
    assert policy.is_success(202) and not policy.is_success(302)


def test_platform_appa_doubles_from_1min_up_to_6h_for_14_days() -> None:
    policy = BUILTIN_POLICIES["platform-appa"]
    minutes = offsets(list(attempt_times(policy, START)), M)
    assert minutes[:12] == [0, 1, 3, 7, 15, 31, 63, 127, 255, 511, 871, 1231]
    assert minutes == [0, 1, 3, 7, 15, 31, 63, 127, 255, *range(511, 20_160, 360)]
    assert len(minutes) == 64 and minutes[-1] == 19_951  # 13 d 20 h 31 min
    assert policy.deadline(START) == START + timedelta(days=14)
    assert policy.next_attempt(64, START, START + 19_951 * M) is None  # 20,311 min > 14 d


def test_standard_eight_attempts_then_give_up() -> None:
    policy = BUILTIN_POLICIES["standard"]
    times = offsets(list(attempt_times(policy, START)))
    assert times == [0, 5, 305, 2105, 9305, 27305, 63305, 99305]  # last: 27 h 35 min 05 s
    assert policy.next_attempt(8, START, START + 99305 * S) is None


def test_attempt_times_stops_at_the_successful_attempt() -> None:
    policy = BUILTIN_POLICIES["standard"]
    assert offsets(list(attempt_times(policy, START, succeed_at=3))) == [0, 5, 305]
    assert offsets(list(attempt_times(policy, START, succeed_at=1))) == [0]


def test_the_delay_counts_from_the_failure_not_the_attempt() -> None:
    policy = BUILTIN_POLICIES["platform-numinfo"]
    with freeze_time(START + 2 * S):  # the answer budget ran out
        assert policy.next_attempt(1, START, datetime.now(UTC)) == START + 2 * S + M


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="attempts"):
        BUILTIN_POLICIES["standard"].next_attempt(0, START, START)


# --- custom policies ------------------------------------------------------------------------------

TOML = """
[quick]
type = "delays"
delays = ["1s", "2s", "5s"]
then = "5s"
give_up_after = "1m"

[offsets]  # the other reading: attempts at 1, 5, 10 min after the first
type = "delays"
delays = ["1m", "4m", "5m"]

[capped]
type = "exponential"
first = "1s"
factor = 3
max_delay = "20s"
max_attempts = 6

[spread]
type = "exponential"
first = "10s"
give_up_after = "1h"
jitter = 0.1
pause_after = 5
pause_for = "1m"

[platform-status]
delays = ["10s", "1m"]
"""


def test_custom_policies_from_toml() -> None:
    policies = resolve_policies(CONFIGS.validate_python(tomllib.loads(TOML)))
    assert set(policies) == {*BUILTIN_POLICIES, "quick", "offsets", "capped", "spread"}

    quick = offsets(list(attempt_times(policies["quick"], START)))
    assert quick == [0, 1, 3, 8, *range(13, 61, 5)]
    assert offsets(list(attempt_times(policies["offsets"], START)), M) == [0, 1, 5, 10]
    assert offsets(list(attempt_times(policies["capped"], START))) == [0, 1, 4, 13, 33, 53]
    assert offsets(list(attempt_times(policies["platform-status"], START))) == [0, 10, 70]

    spread = policies["spread"]
    assert isinstance(spread, ExponentialPolicy)
    assert (spread.first, spread.factor, spread.jitter) == (10 * S, 2.0, 0.1)
    assert (spread.pause_after, spread.pause_for, spread.give_up_after) == (5, M, H)
    assert BUILTIN_POLICIES["platform-status"].delays == (30 * S, 2 * M)  # unchanged


def test_standard_may_be_redefined_but_no_platform_policy() -> None:
    policies = resolve_policies(
        CONFIGS.validate_python({"standard": {"type": "delays", "delays": ["1s"]}})
    )
    assert offsets(list(attempt_times(policies["standard"], START))) == [0, 1]

    table = {"type": "delays", "delays": ["1s"], "then": "1s", "give_up_after": "1h"}
    with pytest.raises(ValidationError, match="cannot be redefined"):
        CONFIGS.validate_python({"platform-sms": table})
    direct = TypeAdapter(dict[str, PolicyConfig]).validate_python({"platform-sms": table})
    with pytest.raises(ValueError, match="cannot be redefined"):
        resolve_policies(direct)
    with pytest.raises(ValidationError, match="platform-status takes only delays"):
        CONFIGS.validate_python({"platform-status": table})


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"delays": ["1s"], "then": "1s"}, 'type = "delays" or "exponential"'),
        ({"delays": ["1s"]}, 'type = "delays" or "exponential"'),
        ({"type": "linear"}, 'type = "delays" or "exponential"'),
        ({"type": "delays"}, "give delays, then, or both"),
        ({"type": "delays", "delays": ["0s"]}, "delays must be positive"),
        ({"type": "delays", "delays": ["1 fortnight"]}, "not a duration"),
        ({"type": "delays", "delays": ["1s"], "then": "1s"}, "give_up_after or max_attempts"),
        ({"type": "exponential", "first": "1s"}, "give_up_after or max_attempts"),
        ({"type": "exponential", "first": "1m", "max_delay": "1s", "max_attempts": 3}, "max_delay"),
        ({"type": "exponential", "first": "1s", "factor": 0.5, "max_attempts": 3}, "factor"),
        ({"type": "delays", "delays": ["1s"], "jitter": 1}, "jitter"),
        ({"type": "delays", "delays": ["1s"], "pause_after": 3}, "pause_after and pause_for"),
        ({"type": "delays", "delays": ["1s"], "retries": 3}, "retries"),
    ],
)
def test_bad_policy_tables_are_refused_clearly(table: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        CONFIGS.validate_python({"custom": table})


@pytest.mark.parametrize(
    "table",
    [
        {"delays": ["1s"]},  # one delay: three attempts is the platform's
        {"delays": ["1s", "2s", "3s"]},
        {"delays": ["1s", "2s"], "jitter": 0.1},
        {"delays": ["1s", "2s"], "max_attempts": 5},
        {"type": "delays", "delays": ["1s", "2s"], "jitter": 0.1},
    ],
)
def test_platform_status_takes_exactly_two_delays_and_nothing_else(table: dict) -> None:
    with pytest.raises(ValidationError):
        CONFIGS.validate_python({"platform-status": table})


# --- jitter ---------------------------------------------------------------------------------------


def test_jitter_stays_within_bounds_and_is_deterministic_with_a_seeded_rng() -> None:
    policy = DelaysPolicy(name="spread", delays=(), then=100 * S, max_attempts=500, jitter=0.1)
    first = list(attempt_times(policy, START, rng=random.Random(7)))
    again = list(attempt_times(policy, START, rng=random.Random(7)))
    other = list(attempt_times(policy, START, rng=random.Random(8)))
    assert first == again != other
    gaps = [(b - a) / S for a, b in pairwise(first)]
    assert len(gaps) == 499
    assert all(90 <= gap <= 110 for gap in gaps)
    assert min(gaps) < 92 and max(gaps) > 108  # spread over the whole band
    # without an rng there is no jitter
    assert offsets(list(attempt_times(policy, START)))[:3] == [0, 100, 200]


@pytest.mark.parametrize("name", sorted(BUILTIN_POLICIES))
def test_platform_policies_ignore_an_rng_and_cannot_take_jitter(name: str) -> None:
    policy = BUILTIN_POLICIES[name]
    assert list(attempt_times(policy, START, rng=random.Random(1))) == list(
        attempt_times(policy, START)
    )
    if name.startswith("platform-"):
        with pytest.raises(ValueError, match="no jitter"):
            DelaysPolicy(name=name, delays=(S,), jitter=0.1)


# --- Retry-After ----------------------------------------------------------------------------------


def test_retry_after_is_honoured_within_bounds() -> None:
    now, next_time = START, START + 10 * S
    assert retry_after_bounded(next_time, now, None) == next_time
    assert retry_after_bounded(next_time, now, 5 * S) == next_time  # never earlier than the policy
    assert retry_after_bounded(next_time, now, 120 * S) == now + 120 * S
    assert retry_after_bounded(next_time, now, 5 * H) == now + H  # at most an hour
    assert retry_after_bounded(next_time, now, 5 * H, max_retry_after=10 * M) == now + 10 * M
    later = START + 2 * H  # the policy's own time wins when it is later than the bound
    assert retry_after_bounded(later, now, 5 * H) == later


# --- properties -----------------------------------------------------------------------------------

durations = st.integers(min_value=1, max_value=10**9).map(lambda us: timedelta(microseconds=us))
maybe = st.none() | durations
jitters = st.sampled_from([0.0, 0.1, 0.5, 0.99])
attempt_limits = st.none() | st.integers(min_value=1, max_value=50)


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    give_up_after, max_attempts = draw(maybe), draw(attempt_limits)
    if give_up_after is None and max_attempts is None:
        max_attempts = 30
    common = {"give_up_after": give_up_after, "max_attempts": max_attempts, "jitter": draw(jitters)}
    if draw(st.booleans()):
        pause = draw(st.none() | st.integers(min_value=1, max_value=5))
        common |= {"pause_after": pause, "pause_for": pause and draw(durations)}
        return DelaysPolicy(
            name="p",
            delays=tuple(draw(st.lists(durations, max_size=5))),
            then=draw(durations),
            **common,
        )
    first = draw(durations)
    max_delay = draw(st.none() | durations.map(lambda d: d + first))
    factor = draw(st.floats(min_value=1, max_value=10))
    return ExponentialPolicy(name="p", first=first, factor=factor, max_delay=max_delay, **common)


@given(
    policy=policies() | st.sampled_from(list(BUILTIN_POLICIES.values())),
    attempts=st.integers(min_value=1, max_value=10**6),
    elapsed=st.integers(min_value=0, max_value=10**12).map(lambda us: timedelta(microseconds=us)),
    seed=st.integers(),
)
def test_the_next_attempt_is_after_now_and_never_after_give_up(
    policy: Policy, attempts: int, elapsed: timedelta, seed: int
) -> None:
    now = START + elapsed
    next_time = policy.next_attempt(attempts, START, now, random.Random(seed))
    if next_time is None:
        return
    assert next_time > now
    deadline = policy.deadline(START)
    assert deadline is None or next_time <= deadline
    assert policy.max_attempts is None or attempts < policy.max_attempts


@given(policy=policies(), seed=st.integers(), breaker=st.booleans())
def test_a_walk_is_increasing_and_ends_within_the_limits(
    policy: Policy, seed: int, breaker: bool
) -> None:
    walk = attempt_times(policy, START, rng=random.Random(seed), breaker=breaker)
    times = list(islice(walk, 2000))
    assert len(times) <= (policy.max_attempts or 2000)
    assert times[0] == START
    assert all(a < b for a, b in pairwise(times))
    deadline = policy.deadline(START)
    assert deadline is None or times[-1] <= deadline
    again = list(
        islice(attempt_times(policy, START, rng=random.Random(seed), breaker=breaker), 2000)
    )
    assert again == times
