"""One `relay simulate` run over several sender processes (``--processes N``).

What it buys: one Python process builds and sends ~8,500 callbacks/s on a core of its own
(~110 us of CPU per callback); N processes use N cores. On the 2-core machine of
docs/simulator.md ("Load testing"), busy with other jobs, two processes sent 4,170 and 5,652
callbacks/s where one sent 2,223 and 2,794 (same endpoint, same minute).

How: the run is split into N shares (:func:`split`): counts that differ by at most one and add
up to ``--count``, the rate shared in proportion, the connections divided (rounded up), and each
share its own seed (``S/i`` from ``--seed S``), so every callback stays distinct. Each share
runs in a spawned process; they build their payloads, wait for each other, then send at the
same time. Their failure lines, progress and results come back to this process, which prints
them and makes one report: the attempts in share order, the elapsed time from the first start
to the last end, the rate from the first callback sent to the last, over all of them.

How to turn it off: ``--processes 1`` (the default) runs in this process, as before.
"""

from __future__ import annotations

import math
import multiprocessing
import queue
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relay.simulator.platform import CallbackResult

PROGRESS_EVERY = 256
"""A share tells its progress every this many callbacks (and at its end)."""
START_TIMEOUT_SECONDS = 600.0
"""How long shares wait for each other to have built their payloads."""


@dataclass(frozen=True)
class Share:
    """One process's part of the run."""

    index: int
    count: int
    rate: float | None
    concurrency: int
    seed: int | str | None


def split(
    count: int, rate: float | None, concurrency: int, seed: int | None, processes: int
) -> list[Share]:
    """``processes`` shares of a run (fewer when ``count`` is smaller): see the module."""
    if count < 1 or concurrency < 1 or processes < 1:
        raise ValueError("count, concurrency and processes are at least 1")
    n = min(processes, count)
    base, extra = divmod(count, n)
    shares = []
    for index in range(n):
        share_count = base + (1 if index < extra else 0)
        shares.append(
            Share(
                index,
                share_count,
                None if rate is None else rate * share_count / count,
                math.ceil(concurrency / n),
                None if seed is None else f"{seed}/{index}",
            )
        )
    return shares


@dataclass
class ShareResult:
    """What one share did: its results, when it started and ended, and its pacer's figures
    (``time.monotonic()`` is one clock for every process of the machine)."""

    results: list[CallbackResult]
    started: float
    ended: float
    sent: int
    first_at: float | None
    last_at: float | None


@dataclass
class Merged:
    """The shares' figures as one run's (the pacer's ``rate`` and ``achieved_rate``)."""

    rate: float | None
    shares: list[ShareResult] = field(default_factory=list)

    @property
    def results(self) -> list[CallbackResult]:
        return [result for share in self.shares for result in share.results]

    @property
    def elapsed(self) -> float:
        return max(s.ended for s in self.shares) - min(s.started for s in self.shares)

    @property
    def achieved_rate(self) -> float | None:
        firsts = [s.first_at for s in self.shares if s.first_at is not None]
        lasts = [s.last_at for s in self.shares if s.last_at is not None]
        sent = sum(s.sent for s in self.shares)
        if not firsts or not lasts or max(lasts) <= min(firsts):
            return None
        return (sent - 1) / (max(lasts) - min(firsts))


class Reporter:
    """A share's way back to the parent: failure lines, totals and progress, its result."""

    def __init__(self, channel: Any, index: int) -> None:
        self._channel = channel
        self._index = index
        self._done = 0

    def total(self, callbacks: int) -> None:
        self._channel.put(("total", self._index, callbacks))

    def line(self, text: str) -> None:
        self._channel.put(("line", self._index, text))

    def advance(self) -> None:
        self._done += 1
        if self._done >= PROGRESS_EVERY:
            self.flush()

    def flush(self) -> None:
        if self._done:
            self._channel.put(("done", self._index, self._done))
            self._done = 0

    def result(self, outcome: ShareResult) -> None:
        self.flush()
        self._channel.put(("result", self._index, outcome))

    def failed(self, error: str) -> None:
        self._channel.put(("error", self._index, error))


ShareRunner = Callable[[Share, dict[str, Any], Reporter, Callable[[], None]], ShareResult]
"""Runs one share in its process: (share, the command's options, reporter, wait for the
others to be ready) -> its result. A module-level function (spawned processes import it)."""


def _child(
    runner: ShareRunner, share: Share, options: dict[str, Any], channel: Any, barrier: Any
) -> None:
    reporter = Reporter(channel, share.index)
    try:
        reporter.result(
            runner(share, options, reporter, lambda: barrier.wait(START_TIMEOUT_SECONDS))
        )
    except BaseException:  # told to the parent, which fails the run with it
        reporter.failed(traceback.format_exc(limit=5))


def _check_alive(processes: list[Any], outcomes: dict[int, ShareResult]) -> None:
    for index, process in enumerate(processes):
        # status 0: it sent its result (or error) before it ended; the queue still has it
        if index not in outcomes and not process.is_alive() and process.exitcode != 0:
            raise RuntimeError(f"a sender process ended with status {process.exitcode}")


def run_shares(
    runner: ShareRunner,
    shares: list[Share],
    options: dict[str, Any],
    *,
    rate: float | None,
    on_line: Callable[[str], None],
    on_total: Callable[[int], None],
    on_done: Callable[[int], None],
) -> Merged:
    """Run each share in a spawned process; their lines, total and progress as they come.
    RuntimeError when a share failed or its process died."""
    context = multiprocessing.get_context("spawn")
    channel = context.Queue()
    barrier = context.Barrier(len(shares))
    processes = [
        context.Process(target=_child, args=(runner, share, options, channel, barrier), daemon=True)
        for share in shares
    ]
    for process in processes:
        process.start()
    outcomes: dict[int, ShareResult] = {}
    totals: dict[int, int] = {}
    try:
        while len(outcomes) < len(shares):
            try:
                kind, index, value = channel.get(timeout=1.0)
            except queue.Empty:
                _check_alive(processes, outcomes)
                continue
            if kind == "line":
                on_line(value)
            elif kind == "total":
                totals[index] = value
                if len(totals) == len(shares):
                    on_total(sum(totals.values()))
            elif kind == "done":
                on_done(value)
            elif kind == "result":
                outcomes[index] = value
            else:
                raise RuntimeError(f"sender process {index} failed:\n{value}")
    finally:
        for process in processes:
            if process.is_alive() and len(outcomes) < len(shares):
                process.terminate()
            process.join(timeout=10)
    return Merged(rate, [outcomes[i] for i in range(len(shares))])
