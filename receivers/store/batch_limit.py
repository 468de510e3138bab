"""How many of the waiting items the writer process puts in its next batch.

Taking everything that waits makes the fewest commits, but while one long batch is written,
every caller in it waits, and a server whose callers all wait for the store has nothing to do:
serving and writing take turns. Smaller batches let the server answer the first callers while
the next batch is written. Measured with ``scripts/bench_ingest.py`` (SQLite, 64 connections, a
disk whose ``fsync`` takes 0.2 ms): batches of at most 16 gave 6-10 % more events/s than taking
everything (up to 64); at most 8 was slower (too many commits).

A slow disk wants the opposite: when each commit waits milliseconds for the disk, only large
batches keep up. So the limit adapts to what a batch costs per item: it starts at
:data:`SMALLEST`; a full batch whose items took more than :data:`SLOW_ITEM_SECONDS` each (the
commit's own cost dominates) doubles it, up to :data:`LARGEST`; a full batch under half that, or
a writer that finds nothing waiting, halves it again."""

from __future__ import annotations

SMALLEST = 16
"""The limit when commits are cheap."""
LARGEST = 256
"""The limit when commits are slow."""
SLOW_ITEM_SECONDS = 100e-6
"""Batch time per item above which a full batch is taken as bound by its commit (an item of its
own costs the writer 15-55 µs on the machines measured; a 3 ms ``fsync`` over 16 items adds
190 µs)."""


class BatchLimit:
    """The writer process's batch size; see the module docstring."""

    def __init__(
        self,
        smallest: int = SMALLEST,
        largest: int = LARGEST,
        slow_item_seconds: float = SLOW_ITEM_SECONDS,
    ) -> None:
        if not 1 <= smallest <= largest:
            raise ValueError("need 1 <= smallest <= largest")
        self.smallest = smallest
        self.largest = largest
        self.slow_item_seconds = slow_item_seconds
        self.value = smallest

    def take(self, waiting: int, *, idle: bool = False) -> int:
        """How many of the ``waiting`` items the next batch takes. ``idle``: the writer found
        nothing waiting and waited for these (it keeps up: the limit halves)."""
        if idle:
            self._shrink()
        return min(waiting, self.value)

    def written(self, count: int, seconds: float) -> None:
        """Note that a batch of ``count`` items took ``seconds`` to write (and answer)."""
        if count < self.value:
            return  # not full: the limit did not decide its size
        per_item = seconds / count
        if per_item > self.slow_item_seconds:
            self.value = min(self.value * 2, self.largest)
        elif per_item < self.slow_item_seconds / 2:
            self._shrink()

    def _shrink(self) -> None:
        self.value = max(self.value // 2, self.smallest)
