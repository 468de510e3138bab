"""The writer process's batch limit: small while commits are cheap, larger when they are slow."""

from __future__ import annotations

import pytest

from receivers.store.batch_limit import BatchLimit

SLOW = 100e-6  # seconds per item above which a full batch counts as bound by its commit


def limit() -> BatchLimit:
    return BatchLimit(smallest=16, largest=64, slow_item_seconds=SLOW)


def test_a_batch_takes_what_waits_up_to_the_limit() -> None:
    batches = limit()
    assert batches.take(5) == 5 and batches.take(40) == 16


def test_slow_full_batches_double_the_limit_up_to_the_largest() -> None:
    batches = limit()
    batches.written(16, 16 * 3 * SLOW)  # e.g. a 3 ms fsync shared by 16 items
    assert batches.value == 32 and batches.take(100) == 32
    batches.written(32, 32 * 1.5 * SLOW)
    batches.written(64, 64 * 1.5 * SLOW)
    assert batches.value == 64 and batches.take(100) == 64


def test_cheap_full_batches_halve_it_and_middling_ones_keep_it() -> None:
    batches = limit()
    batches.written(16, 16 * 2 * SLOW)
    batches.written(32, 32 * 2 * SLOW)
    assert batches.value == 64
    batches.written(64, 64 * 0.75 * SLOW)
    assert batches.value == 64
    batches.written(64, 64 * 0.4 * SLOW)
    assert batches.value == 32
    batches.written(32, 32 * 0.4 * SLOW)
    batches.written(16, 16 * 0.4 * SLOW)
    assert batches.value == 16


def test_a_batch_smaller_than_the_limit_changes_nothing() -> None:
    batches = limit()
    batches.written(15, 15 * 10 * SLOW)  # slow, but the limit did not decide its size
    assert batches.value == 16


def test_a_writer_that_found_nothing_waiting_halves_it() -> None:
    batches = limit()
    batches.written(16, 16 * 2 * SLOW)
    batches.written(32, 32 * 2 * SLOW)
    assert batches.take(100, idle=True) == 32
    assert batches.take(100, idle=False) == 32
    assert batches.take(100, idle=True) == 16 and batches.take(100, idle=True) == 16


@pytest.mark.parametrize(("smallest", "largest"), [(0, 10), (20, 10)])
def test_bounds_must_make_sense(smallest: int, largest: int) -> None:
    with pytest.raises(ValueError, match="smallest"):
        BatchLimit(smallest, largest)
