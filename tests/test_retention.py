"""Retention: what a prune removes (old events whose deliveries all ended, with their deliveries,
attempts and routed marks; old quarantined bodies) and what it never removes (anything pending,
held or not yet routed), in short batches, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta

import pytest
from sqlalchemy import inspect as schema_of
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from relay import outbox
from relay.outbox.tables import DEAD, HELD, PENDING, SUCCEEDED
from relay.simulator import factories
from relay.store import retention
from relay.store.retention import Pruned
from tests.relay_support import START, Clock, Relay, store_events
from tests.retention_support import (
    ATTEMPTS_PER_DELIVERY,
    EVENTS,
    Planned,
    event_with,
    left,
    quarantine,
    row_counts,
)
from tests.support import Answer, Sink, serving

CUTOFF = START + timedelta(days=30)
BEFORE = CUTOFF - timedelta(days=1)
AFTER = CUTOFF + timedelta(hours=1)
ENDED = timedelta(hours=1)
"""How long after its event a final delivery of these tests ended."""
FINAL = ("succeeded", "dead")


def planned(state: str, received: object) -> Planned:
    """A delivery in ``state``; ``dead since`` is dead, but ended after the cutoff (replayed
    after it, and dead again)."""
    assert isinstance(received, type(START))
    return {
        "pending": Planned(PENDING),
        "held": Planned(HELD),
        "succeeded": Planned(SUCCEEDED, received + ENDED),
        "dead": Planned(DEAD, received + ENDED),
        "dead since": Planned(DEAD, AFTER),
    }[state]


STATES = ("pending", "held", "succeeded", "dead", "dead since")


async def test_an_event_goes_once_routed_old_and_every_delivery_ended_before_the_cutoff(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "BATCH_EVENTS", 4)  # many batches, kept rows between them
    plans: dict[str, tuple[object, tuple[str, ...] | None]] = {}
    for at in (BEFORE, CUTOFF, AFTER):
        unrouted = await event_with(engine, f"unrouted {at}", at, None)
        plans[unrouted] = (at, None)
        for count in range(3):
            for states in itertools.product(STATES, repeat=count):
                key = f"{at} {states}"
                event_id = await event_with(engine, key, at, [planned(s, at) for s in states])
                plans[event_id] = (at, states)
    before = await left(engine)

    counted = await retention.count_prunable(engine, CUTOFF)
    pruned = await retention.prune(engine, CUTOFF)

    going = {
        event_id
        for event_id, (at, states) in plans.items()
        if states is not None and at == BEFORE and all(s in FINAL for s in states)
    }
    assert len(going) == 1 + 2 + 4  # no delivery; one of 2 final states; two of them
    after = await left(engine)
    assert after.events == before.events - going
    assert after.routed == before.routed - going
    assert after.deliveries == {d: e for d, e in before.deliveries.items() if e not in going}
    assert after.attempts == {
        d: n for d, n in before.attempts.items() if before.deliveries[d] not in going
    }
    gone = [d for d, e in before.deliveries.items() if e in going]
    expected = Pruned(len(going), len(gone), len(gone) * ATTEMPTS_PER_DELIVERY, 0)
    assert pruned == counted == expected
    assert await retention.prune(engine, CUTOFF) == Pruned()  # nothing left to remove


async def test_quarantined_bodies_go_once_last_seen_before_the_cutoff(engine: AsyncEngine) -> None:
    await quarantine(engine, b"{old", BEFORE)
    await quarantine(engine, b"{seen again", BEFORE)
    await quarantine(engine, b"{seen again", AFTER)  # the same body, later: its row is renewed
    await quarantine(engine, b"{at the cutoff", CUTOFF)
    await quarantine(engine, b"{new", AFTER)

    assert await retention.count_prunable(engine, CUTOFF) == Pruned(rejected=1)
    assert await retention.prune(engine, CUTOFF) == Pruned(rejected=1)

    async with engine.connect() as conn:
        bodies = set((await conn.execute(select(retention.REJECTED.c.raw_body))).scalars())
    assert bodies == {b"{seen again", b"{at the cutoff", b"{new"}


async def test_a_delivery_replayed_after_its_event_was_chosen_keeps_the_event(
    engine: AsyncEngine,
) -> None:
    event_id = await event_with(engine, "replayed", BEFORE, [planned("dead", BEFORE)])
    candidates = [event_id]  # chosen while its delivery was dead ...
    replayed = await outbox.replay(engine, CUTOFF, status=DEAD)  # ... then replayed

    assert await retention.remove_events(engine, CUTOFF, candidates) == Pruned()

    after = await left(engine)
    assert after.events == {event_id}
    assert set(after.deliveries) == {d.id for d in replayed}
    assert after.attempts == {replayed[0].id: ATTEMPTS_PER_DELIVERY}


async def test_batches_are_bounded_by_their_count_and_their_bodies_and_pause_between(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "BATCH_EVENTS", 3)
    monkeypatch.setattr(retention, "BATCH_BYTES", 1000)
    sizes = [100, 100, 100, 100, 600, 600, 5000, 100]
    for index, size in enumerate(sizes):
        body = b"x" * size
        at = BEFORE + timedelta(seconds=index)
        await event_with(engine, f"k{index}", at, [planned("succeeded", at)], raw_body=body)
    await quarantine(engine, b"{" * 900, BEFORE)
    await quarantine(engine, b"[" * 900, BEFORE)
    told: list[Pruned] = []
    paused: list[float] = []

    async def pause(seconds: float) -> None:
        paused.append(seconds)

    pruned = await retention.prune(engine, CUTOFF, progress=told.append, pause=pause)

    assert pruned == Pruned(8, 8, 8 * ATTEMPTS_PER_DELIVERY, 2)
    events_told = [p.events for p in told]
    # 3 by count; 100 + 600 (another 600 passes 1000 bytes); 600 alone; 5000 alone (at least
    # one per batch), then the last; then the quarantine, 900 bytes a batch
    assert events_told == [3, 5, 6, 7, 8, 8, 8]
    assert [p.rejected for p in told] == [0, 0, 0, 0, 0, 1, 2]
    assert len(paused) == len(told) and all(seconds >= 0 for seconds in paused)


async def test_two_prunes_at_once_remove_each_row_once(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "BATCH_EVENTS", 2)
    for index in range(12):
        await event_with(engine, f"k{index}", BEFORE, [planned("succeeded", BEFORE)])
    await event_with(engine, "kept", BEFORE, [planned("pending", BEFORE)])

    first, second = await asyncio.gather(
        retention.prune(engine, CUTOFF), retention.prune(engine, CUTOFF)
    )

    assert first.events + second.events == 12
    assert first.deliveries + second.deliveries == 12
    assert first.attempts + second.attempts == 12 * ATTEMPTS_PER_DELIVERY
    assert len((await left(engine)).events) == 1


async def test_an_old_history_through_the_real_paths_leaves_only_the_bounded_tables(
    engine: AsyncEngine,
) -> None:
    """The class of defect behind the issue: a table that grows with traffic and that nothing
    empties. Every table of the schema is emptied by a prune past its whole history, but
    those whose size the configuration bounds (one row per destination, per setting) and the
    console's, whose rows expire on their own (tests/test_console_sessions.py)."""
    clock = Clock()
    async with serving(Sink()) as sink:
        sink.answers["/broken"] = Answer(500, body=b"broken")
        destinations = {
            "crm": {"type": "http", "url": sink.url("/crm")},
            "broken": {"type": "http", "url": sink.url("/broken"), "policy": "once"},
        }
        once = {"once": {"type": "delays", "delays": ["1s"], "max_attempts": 1}}
        relay_ = Relay(engine, destinations, clock, policies=once)
        posts = [
            ("/hooks/sms/dlr", factories.sms_dlr()),
            ("/hooks/tts/events", factories.tts_event()),
        ]
        await store_events(engine, posts, clock)
        await quarantine(engine, b"{broken", clock())
        try:
            for due in await relay_.route_all():
                await relay_.deliverer.attempt(due.id)
        finally:
            await relay_.aclose()
    async with engine.connect() as conn:
        tables = await conn.run_sync(lambda sync: schema_of(sync).get_table_names())
    bounded = {"alembic_version", "destination_states", "relay_instance_settings"}
    bounded |= {"console_sessions", "console_login_throttle"}  # they expire on their own
    growing = [retention.REJECTED.metadata.tables[name] for name in tables if name not in bounded]
    assert all((await row_counts(engine, growing)).values())  # the history fills every one

    clock.advance(timedelta(days=1))
    assert await retention.prune(engine, clock()) == Pruned(2, 4, 4, 1)

    assert await row_counts(engine, growing) == dict.fromkeys((table.name for table in growing), 0)


async def test_the_candidates_are_found_through_the_received_at_index(
    sqlite_engine: AsyncEngine,
) -> None:
    query = (
        select(EVENTS.c.id)
        .where(retention.prunable(CUTOFF))
        .order_by(EVENTS.c.received_at, EVENTS.c.id)
        .limit(retention.BATCH_EVENTS)
    )
    async with sqlite_engine.connect() as conn:
        compiled = query.compile(conn.sync_engine, compile_kwargs={"literal_binds": True})
        plan = [row[-1] for row in await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}")]
    assert any("ix_received_events_received_at" in step for step in plan), plan
    assert not [step for step in plan if step.startswith("SCAN")], plan  # every table searched
    assert any("SEARCH deliveries USING INDEX" in step for step in plan), plan


async def test_the_retention_never_removes_what_the_platform_may_still_send_again() -> None:
    assert retention.platform_retry_window() == timedelta(days=14)  # platform-appa
    assert retention.shortest_retention() == timedelta(days=15)
