"""The coalescer: one group at a time, the calls made meanwhile together in the next one, each
caller answered with its own result; and the sizes of its groups, fixed or adaptive."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from itertools import count

import pytest

from receivers.store.coalescer import AdaptiveGroupSize, Coalescer, FixedGroupSize
from tests.store_support import eventually, within

SLOW = 100e-6  # seconds per call above which a full group counts as bound by its commit


class Gated:
    """A group runner whose groups end only when the test says so (each with its items'
    results, or an exception for the whole group)."""

    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self._gates: list[asyncio.Future[BaseException | None]] = []

    async def __call__(self, items: list[str]) -> list[str]:
        self.groups.append(list(items))
        gate: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self._gates.append(gate)
        failure = await gate
        if failure is not None:
            raise failure
        return [f"wrote {item}" for item in items]

    async def started(self, groups: int) -> None:
        """Wait until ``groups`` groups have started."""
        await eventually(lambda: len(self.groups) >= groups)

    def end(self, group: int, failure: BaseException | None = None) -> None:
        self._gates[group].set_result(failure)


class Recording:
    """A group runner that ends at once and records each group's size."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    async def __call__(self, items: list[int]) -> list[int]:
        self.sizes.append(len(items))
        return [item * 10 for item in items]


async def test_a_call_runs_at_once_and_the_calls_made_meanwhile_go_together_next() -> None:
    runner = Gated()
    group: Coalescer[str, str] = Coalescer(runner)
    assert not group.busy
    first = group.put("a")
    await runner.started(1)
    later = [group.put(item) for item in "bcd"]
    assert group.busy

    runner.end(0)
    assert await within(first) == "wrote a"
    await runner.started(2)
    assert not any(future.done() for future in later)  # their group is still running
    runner.end(1)
    assert [await within(future) for future in later] == ["wrote b", "wrote c", "wrote d"]

    assert runner.groups == [["a"], ["b", "c", "d"]]
    await within(group.drain())
    assert not group.busy


async def test_a_group_takes_at_most_its_size() -> None:
    runner = Recording()
    group: Coalescer[int, int] = Coalescer(runner, size=FixedGroupSize(3))
    assert await group.submit_many(list(range(8))) == [item * 10 for item in range(8)]
    assert runner.sizes == [3, 3, 2]


async def test_each_caller_gets_its_own_result_or_exception() -> None:
    async def run(items: list[str]) -> Sequence[str | BaseException]:
        return [ValueError(item) if item.startswith("bad") else item.upper() for item in items]

    group: Coalescer[str, str] = Coalescer(run)
    answers = await group.submit_many(["a", "bad b", "c"])
    assert answers[0] == "A" and answers[2] == "C"
    assert isinstance(answers[1], ValueError) and str(answers[1]) == "bad b"

    assert await group.submit("d") == "D"
    with pytest.raises(ValueError, match="bad e"):
        await group.submit("bad e")


async def test_a_failed_group_fails_each_of_its_callers_and_the_next_group_runs() -> None:
    runner = Gated()
    group: Coalescer[str, str] = Coalescer(runner)
    first = group.put("a")
    await runner.started(1)
    failing = [group.put(item) for item in "bc"]
    runner.end(0)
    await within(first)

    await runner.started(2)
    lost = ConnectionError("lost")
    runner.end(1, lost)
    for future in failing:
        with pytest.raises(ConnectionError):
            await within(future)
        assert future.exception() is lost

    after = group.put("d")
    await runner.started(3)
    runner.end(2)
    assert await within(after) == "wrote d"
    assert runner.groups == [["a"], ["b", "c"], ["d"]]


async def test_a_cancelled_caller_does_not_hold_up_the_others_of_its_group() -> None:
    runner = Gated()
    group: Coalescer[str, str] = Coalescer(runner)
    first = group.put("a")
    await runner.started(1)
    gone = asyncio.ensure_future(group.submit("b"))
    await asyncio.sleep(0)  # the submit queues "b"
    kept = group.put("c")
    gone.cancel()

    runner.end(0)
    await within(first)
    await runner.started(2)
    runner.end(1)
    assert await within(kept) == "wrote c"
    assert gone.cancelled()
    assert runner.groups == [["a"], ["b", "c"]]  # "b" was written all the same
    await within(group.drain())
    assert not group.busy


async def test_drain_returns_once_everything_queued_has_run() -> None:
    runner = Gated()
    group: Coalescer[str, str] = Coalescer(runner)
    futures = [group.put("a")]
    await runner.started(1)
    futures.append(group.put("b"))
    drained = asyncio.ensure_future(group.drain())

    runner.end(0)
    await runner.started(2)  # the second group began after the first had ended
    assert not drained.done()
    runner.end(1)
    await within(drained)
    assert all(future.done() for future in futures) and not group.busy


# --- adaptive group sizes ----------------------------------------------------------------------


def limit() -> AdaptiveGroupSize:
    return AdaptiveGroupSize(smallest=16, largest=64, slow_call_seconds=SLOW)


def test_a_group_takes_what_waits_up_to_the_cap_which_starts_at_the_smallest() -> None:
    sizes = limit()
    assert sizes.cap == 16
    assert sizes.take(5, idle=False) == 5 and sizes.take(40, idle=False) == 16
    assert AdaptiveGroupSize().cap == 16 and AdaptiveGroupSize().largest == 256


def test_slow_full_groups_double_the_cap_up_to_the_largest() -> None:
    sizes = limit()
    sizes.ran(16, 16 * 3 * SLOW)  # e.g. a 3 ms fsync shared by 16 calls
    assert sizes.cap == 32 and sizes.take(100, idle=False) == 32
    sizes.ran(32, 32 * 1.5 * SLOW)
    sizes.ran(64, 64 * 1.5 * SLOW)
    assert sizes.cap == 64 and sizes.take(100, idle=False) == 64


def test_cheap_full_groups_halve_it_and_middling_ones_keep_it() -> None:
    sizes = limit()
    sizes.ran(16, 16 * 2 * SLOW)
    sizes.ran(32, 32 * 2 * SLOW)
    assert sizes.cap == 64
    sizes.ran(64, 64 * 0.75 * SLOW)
    assert sizes.cap == 64
    sizes.ran(64, 64 * 0.4 * SLOW)
    assert sizes.cap == 32
    sizes.ran(32, 32 * 0.4 * SLOW)
    sizes.ran(16, 16 * 0.4 * SLOW)
    assert sizes.cap == 16


def test_a_group_smaller_than_the_cap_changes_nothing() -> None:
    sizes = limit()
    sizes.ran(15, 15 * 10 * SLOW)  # slow, but the cap did not decide its size
    assert sizes.cap == 16


def test_a_runner_that_found_nothing_waiting_halves_it() -> None:
    sizes = limit()
    sizes.ran(16, 16 * 2 * SLOW)
    sizes.ran(32, 32 * 2 * SLOW)
    assert sizes.take(100, idle=True) == 32
    assert sizes.take(100, idle=False) == 32
    assert sizes.take(100, idle=True) == 16 and sizes.take(100, idle=True) == 16


@pytest.mark.parametrize(("smallest", "largest"), [(0, 10), (20, 10)])
def test_bounds_must_make_sense(smallest: int, largest: int) -> None:
    with pytest.raises(ValueError, match="smallest"):
        AdaptiveGroupSize(smallest, largest)


def ticking(step: float) -> Callable[[], float]:
    """A clock that moves ``step`` seconds each time it is read."""
    ticks = count()
    return lambda: next(ticks) * step


async def test_the_coalescer_grows_its_groups_while_calls_are_slow_and_shrinks_them_when_idle() -> (
    None
):
    runner = Recording()
    sizes = AdaptiveGroupSize(smallest=2, largest=8, slow_call_seconds=1.0)
    group: Coalescer[int, int] = Coalescer(runner, size=sizes, clock=ticking(10.0))
    await group.submit_many(list(range(30)))
    assert runner.sizes == [2, 4, 8, 8, 8]

    await group.submit_many(list(range(22)))  # nothing waited: the cap is halved first
    assert runner.sizes[5:] == [4, 8, 8, 2]


async def test_the_coalescer_keeps_its_groups_small_while_calls_are_cheap() -> None:
    runner = Recording()
    sizes = AdaptiveGroupSize(smallest=2, largest=8, slow_call_seconds=1.0)
    group: Coalescer[int, int] = Coalescer(runner, size=sizes, clock=ticking(0.0))
    await group.submit_many(list(range(10)))
    assert runner.sizes == [2] * 5


async def test_a_runner_that_answers_too_few_fails_its_whole_group_and_the_next_runs() -> None:
    async def run(items: list[int]) -> list[int | BaseException]:
        return [item * 10 for item in items][:-1] if len(items) > 1 else [items[0] * 10]

    coalescer: Coalescer[int, int] = Coalescer(run)
    results = await within(
        asyncio.gather(coalescer.put(1), coalescer.put(2), return_exceptions=True)
    )
    assert all(isinstance(result, RuntimeError) for result in results)
    assert await within(coalescer.submit(3)) == 30


async def test_a_group_task_cancelled_before_it_starts_does_not_wedge_the_coalescer() -> None:
    async def run(items: list[int]) -> list[int | BaseException]:
        return [item * 10 for item in items]

    coalescer: Coalescer[int, int] = Coalescer(run)
    first = coalescer.put(1)
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            task.cancel()  # the group's task, before its first step
    await asyncio.sleep(0)
    later = coalescer.put(2)
    assert await within(later) == 20
    assert first.done() or await within(first) == 10  # taken by the next group, or failed
    await within(coalescer.drain())
