"""The embedded mode's dispatcher (relay.dispatch.in_process) as a specification: jobs by time,
within the concurrency bound, retries back in, a shutdown that lets attempts finish or leaves
them to their lease, and a crash that leaves the work to the sweeper."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from relay import outbox
from relay.delivery.deliverer import AttemptsFailed
from relay.destinations import parse_destination_config
from relay.dispatch.in_process import InProcessDispatcher
from relay.dispatch.worker import attempt_with
from relay.outbox import Due
from relay.outbox.router import Router
from relay.outbox.sweeper import Sweeper
from relay.simulator import factories
from tests.relay_support import START, Clock, store_events
from tests.store_support import eventually, within

SECOND = timedelta(seconds=1)


class Attempts:
    """A stand-in for the deliverer: records each job's ids; a job waits while ``gate`` is
    closed; ``then`` gives the next jobs a job returns."""

    def __init__(self) -> None:
        self.jobs: list[list[str]] = []
        self.running = 0
        self.most_running = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.then: dict[str, list[Due]] = {}

    async def __call__(self, ids: list[str]) -> list[Due]:
        self.jobs.append(ids)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await self.gate.wait()
        finally:
            self.running -= 1
        return [due for i in ids for due in self.then.pop(i, [])]

    @property
    def ids(self) -> list[str]:
        return [i for job in self.jobs for i in job]


def dispatcher(clock: Clock, concurrency: int = 10, **options: object) -> InProcessDispatcher:
    return InProcessDispatcher(concurrency=concurrency, clock=clock, **options)  # type: ignore[arg-type]


async def test_jobs_run_oldest_first() -> None:
    clock, attempts = Clock(), Attempts()
    queue = dispatcher(clock, concurrency=1)
    await queue.enqueue([Due("c", 0, START - 1 * SECOND), Due("a", 0, START - 3 * SECOND)])
    await queue.enqueue([Due("b", 0, START - 2 * SECOND)])
    queue.start(attempts)
    try:
        await eventually(lambda: len(attempts.jobs) == 3)
        assert attempts.ids == ["a", "b", "c"]
    finally:
        await queue.aclose()


async def test_a_job_waits_for_its_time() -> None:
    clock, attempts = Clock(), Attempts()
    queue = dispatcher(clock)
    queue.start(attempts)
    try:
        await queue.enqueue([Due("later", 0, START + 10 * SECOND), Due("now", 0, START)])
        await eventually(lambda: attempts.ids == ["now"])
        assert queue.held == 1  # "later" is queued, not run

        clock.advance(10 * SECOND)
        await queue.enqueue([Due("now too", 0, START)])  # any change has it look again
        await eventually(lambda: sorted(attempts.ids) == ["later", "now", "now too"])
    finally:
        await queue.aclose()


async def test_at_most_concurrency_jobs_run_at_once() -> None:
    clock, attempts = Clock(), Attempts()
    attempts.gate.clear()
    queue = dispatcher(clock, concurrency=2)
    queue.start(attempts)
    try:
        await queue.enqueue([Due(f"d{i}", 0, START) for i in range(5)])
        await eventually(lambda: attempts.running == 2)
        assert len(attempts.jobs) == 2
        attempts.gate.set()
        await eventually(lambda: len(attempts.jobs) == 5 and queue.held == 0)
        assert attempts.most_running == 2
    finally:
        await queue.aclose()


async def test_a_job_held_is_not_made_twice_and_a_batch_is_one_job() -> None:
    clock, attempts = Clock(), Attempts()
    queue = dispatcher(clock)
    batch = [Due("b1", 0, START, job="batch-1"), Due("b2", 0, START + SECOND, job="batch-1")]
    assert await queue.enqueue([Due("d1", 0, START), *batch]) == 2
    assert await queue.enqueue([Due("d1", 0, START), *batch]) == 0
    assert await queue.enqueue([Due("d1", 1, START)]) == 1  # its next attempt: a new job
    assert await queue.enqueue([]) == 0
    queue.start(attempts)
    try:
        await eventually(lambda: len(attempts.jobs) == 3)
        assert sorted(attempts.jobs) == [["b1", "b2"], ["d1"], ["d1"]]
    finally:
        await queue.aclose()


async def test_the_next_jobs_an_attempt_returns_are_dispatched() -> None:
    clock, attempts = Clock(), Attempts()
    attempts.then["d1"] = [Due("d1", 1, START)]  # a retry, due at once
    queue = dispatcher(clock)
    queue.start(attempts)
    try:
        await queue.enqueue([Due("d1", 0, START)])
        await eventually(lambda: attempts.jobs == [["d1"], ["d1"]] and queue.held == 0)
    finally:
        await queue.aclose()


async def test_a_failed_batch_still_dispatches_the_next_jobs_of_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Failing:
        async def attempt_many(self, ids: list[str]) -> list[Due]:
            raise AttemptsFailed(RuntimeError("boom"), [Due("d2", 1, START)])

    attempt = attempt_with(Failing())  # type: ignore[arg-type]
    assert await attempt(["d1", "d2"]) == [Due("d2", 1, START)]
    assert "attempt of d1, d2 failed: RuntimeError: boom" in caplog.text


async def test_a_failing_or_overlong_job_frees_its_slot(caplog: pytest.LogCaptureFixture) -> None:
    clock, done = Clock(), asyncio.Event()

    async def attempt(ids: list[str]) -> list[Due]:
        if ids == ["fails"]:
            raise RuntimeError("boom")
        if ids == ["hangs"]:
            await asyncio.Event().wait()
        done.set()
        return []

    queue = dispatcher(clock, concurrency=1, timeout=timedelta(0))
    await queue.enqueue([Due("fails", 0, START), Due("hangs", 0, START), Due("ok", 0, START)])
    queue.start(attempt)
    try:
        await within(done.wait())
        assert "job relay:deliver:fails:0" in caplog.text and "boom" in caplog.text
        assert "relay:deliver:hangs:0" in caplog.text and "ran past its lease" in caplog.text
    finally:
        await queue.aclose()


async def test_without_jobs_knows_what_it_holds_and_runs() -> None:
    clock, attempts = Clock(), Attempts()
    attempts.gate.clear()
    queue = dispatcher(clock, concurrency=1)
    running, queued = Due("run", 0, START), Due("wait", 0, START + SECOND)
    batch = Due("b1", 0, START + SECOND, job="batch-1")
    await queue.enqueue([running, queued, batch])
    queue.start(attempts)
    try:
        await eventually(lambda: attempts.ids == ["run"])
        gone = Due("gone", 2, START)
        assert await queue.without_jobs([running, queued, batch, gone]) == [gone]
        assert await queue.without_jobs([Due("run", 1, START)]) == [Due("run", 1, START)]
        attempts.gate.set()
        await eventually(lambda: queue.held == 2)  # "run" ended
        assert await queue.without_jobs([running]) == [running]
    finally:
        await queue.aclose()


async def test_a_shutdown_lets_running_attempts_finish_and_drops_the_queued() -> None:
    clock, attempts = Clock(), Attempts()
    attempts.gate.clear()
    queue = dispatcher(clock, concurrency=1)
    await queue.enqueue([Due("run", 0, START), Due("queued", 0, START)])
    queue.start(attempts)
    await eventually(lambda: attempts.running == 1)
    closing = asyncio.create_task(queue.aclose(grace=60))
    await eventually(lambda: queue.held == 1)  # the queued one was dropped
    assert not closing.done()  # the running one is waited for
    attempts.gate.set()
    await within(closing)
    assert attempts.ids == ["run"] and attempts.running == 0 and queue.held == 0
    assert await queue.enqueue([Due("late", 0, START)]) == 0


async def test_a_shutdown_past_its_grace_cancels_the_attempts_left() -> None:
    clock, attempts = Clock(), Attempts()
    attempts.gate.clear()
    queue = dispatcher(clock)
    queue.start(attempts)
    await queue.enqueue([Due("stuck", 0, START)])
    await eventually(lambda: attempts.running == 1)
    await within(queue.aclose(grace=0))
    assert attempts.running == 0 and queue.held == 0  # cancelled: its lease keeps it


async def test_what_a_crashed_dispatcher_held_is_dispatched_again_by_the_sweeper(
    engine: AsyncEngine,
) -> None:
    clock = Clock()
    router = Router({"crm": parse_destination_config({"type": "http", "url": "http://x/"})})
    await store_events(engine, [("/hooks/sms/dlr", factories.sms_dlr()) for _ in range(3)], clock)
    clock.advance(10 * SECOND)
    crashed = dispatcher(clock)  # routed into it, never started: the process died
    first = Sweeper(engine, router, crashed, clock=clock, interval=SECOND)
    assert (await first.sweep()).routed_events == 3
    assert (await first.sweep()).enqueued_jobs == 0  # held: not dispatched twice

    attempts = Attempts()
    restarted = dispatcher(clock)
    restarted.start(attempts)
    try:
        report = await Sweeper(engine, router, restarted, clock=clock, interval=SECOND).sweep()
        assert report.enqueued_jobs == 3
        due = await outbox.due_deliveries(engine, clock(), 100)
        await eventually(lambda: sorted(attempts.ids) == sorted(d.id for d in due))
    finally:
        await restarted.aclose()
