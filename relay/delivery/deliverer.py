"""One attempt of one delivery: claim it, ask the destination, record what happened, decide next.

The decision is pure policy (:mod:`relay.delivery.policies`) plus the destination's health
(:mod:`relay.delivery.breaker`); this module only sequences it around the I/O.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from receivers.store import Coalescer, StoreWritable, is_unavailable
from relay import outbox
from relay.delivery.breaker import DestinationHealth, after_outcome, hold_until
from relay.delivery.policies import Policy, retry_after_bounded
from relay.destinations import Destination, Outbound, Outcome
from relay.destinations.errors import MAX_ERROR_LENGTH, describe_error, storable
from relay.observe.metrics import FAILED_ATTEMPT, GONE_ATTEMPT, SUCCEEDED_ATTEMPT, WorkerMetrics
from relay.outbox import AttemptRecord, AttemptResult, Claim, Due
from relay.outbox.tables import DEAD, HELD, PENDING, SUCCEEDED
from relay.words import counted

log = logging.getLogger("relay.delivery")  # stable: users filter on it

FALLBACK_POLICY = "standard"
DEFAULT_CONCURRENCY = 50
LINE_DRAIN = 100
"""How many deliveries of a per-key line one attempt goes on to in its job, one after the other,
when its end lets the next go (see :meth:`Deliverer.attempt_many`); 0 hands each next one over
as a job of its own."""


@dataclass(frozen=True)
class Release:
    """A claim given back unused (see :meth:`Deliverer.attempt_many`)."""

    claimed: Claim


OutboxRequest = str | AttemptRecord | Release
"""What attempts ask of the outbox: a claim (a delivery id), a record, a release."""


@dataclass(frozen=True)
class Recorded:
    """The outbox's answer to a record: whether the lease was still the attempt's (else nothing
    was written), the job of the delivery its end let go next (per-key ordering) and, when the
    record asked for it, that delivery claimed in the same transaction."""

    owned: bool
    next_in_line: Due | None = None
    claimed_next: Claim | None = None


class Slots:
    """The worker's bounds on its attempts: at most ``concurrency`` sends at once (from before
    the send to its answer), and at most twice that many attempts not yet recorded (those sends
    and the answers waiting for their group transaction). The second bound is what a killed
    worker can send again."""

    def __init__(self, concurrency: int) -> None:
        self._sending = asyncio.Semaphore(concurrency)
        self._unrecorded = asyncio.Semaphore(2 * concurrency)

    def free_now(self) -> bool:
        """Whether :meth:`take` would not wait."""
        return not (self._sending.locked() or self._unrecorded.locked())

    async def take(self) -> Slot:
        await self._unrecorded.acquire()
        try:
            await self._sending.acquire()
        except BaseException:
            self._unrecorded.release()
            raise
        return Slot(self._sending, self._unrecorded)


class Slot:
    """One attempt's place in :class:`Slots`: :meth:`answered` gives back its send,
    :meth:`free` all it still holds (each once, however often they are called)."""

    def __init__(self, sending: asyncio.Semaphore, unrecorded: asyncio.Semaphore) -> None:
        self._sending: asyncio.Semaphore | None = sending
        self._unrecorded: asyncio.Semaphore | None = unrecorded

    def answered(self) -> None:
        if self._sending is not None:
            self._sending.release()
            self._sending = None

    def free(self) -> None:
        self.answered()
        if self._unrecorded is not None:
            self._unrecorded.release()
            self._unrecorded = None


@dataclass(frozen=True)
class Ended:
    """What one attempt leaves to do: its delivery's own next job (a retry, a wait), if any,
    and the delivery of its per-key line that its end let go (due, not leased), if any."""

    jobs: list[Due]
    next_in_line: Due | None = None
    claimed_next: Claim | None = None
    """``next_in_line``, claimed with the record (when the attempt asked for it)."""


@dataclass(frozen=True)
class Window:
    """Until when a job may start another attempt, so that it ends within its lease: on the
    event loop's clock (arq's job timeout) and on the injected clock (the leases in SQL)."""

    loop_deadline: float
    clock_deadline: datetime

    def open(self, now: datetime) -> bool:
        return asyncio.get_running_loop().time() < self.loop_deadline and now < self.clock_deadline


@dataclass(frozen=True)
class Target:
    """A configured destination: the sender and its timeout."""

    destination: Destination
    timeout: timedelta


def attempt_lease(timeouts: Iterable[timedelta], margin: timedelta) -> timedelta:
    """How long a claimed delivery stays leased: the longest timeout plus a margin."""
    return max(timeouts, default=timedelta(0)) + margin


class Deliverer:
    """Attempts deliveries; shared by every job of one worker. ``lease`` must outlast any
    attempt (the longest destination timeout plus a margin): see :func:`attempt_lease`.

    At most ``concurrency`` attempts are sent at once: an attempt holds a slot from before its
    send until its answer is in; its record then waits for its group transaction without it, so
    the worker keeps sending while records are written (at most ``2 * concurrency`` attempts
    unrecorded at once: what a killed worker sends again, see :class:`Slots`). A lone attempt
    takes its slot before its claim; a batch (:meth:`attempt_many`) is claimed up front and each
    of its attempts waits at most half the lease margin for a slot, so no lease runs out before
    its attempt ends. The claims, records and releases of concurrent attempts share transactions
    (:class:`~receivers.store.coalescer.Coalescer`). Attempts are counted in ``metrics`` (a
    private registry by default). A claim or record that the store refuses (full, unreachable)
    is noted in ``writable`` (logged once, not per attempt): :meth:`attempt_many` leaves such a
    delivery as SQL has it, for the sweeper to hand out again once the store takes writes.
    ``line_drain`` bounds how far :meth:`attempt_many` goes down a per-key line in one call."""

    def __init__(
        self,
        engine: AsyncEngine,
        targets: Mapping[str, Target],
        policies: Mapping[str, Policy],
        *,
        clock: Callable[[], datetime],
        lease: timedelta,
        rng: random.Random | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        metrics: WorkerMetrics | None = None,
        writable: StoreWritable | None = None,
        line_drain: int = LINE_DRAIN,
    ) -> None:
        self._engine = engine
        self._line_drain = line_drain
        self._writable = writable if writable is not None else StoreWritable(outbox.RELAY_WRITES)
        self._targets = targets
        self._policies = policies
        self._clock = clock
        self._rng = rng or random.Random()
        self._lease = lease
        self._slots = Slots(concurrency)
        longest = max((t.timeout for t in targets.values()), default=timedelta(0))
        self._start_window = max(lease - longest, timedelta(0)).total_seconds() / 2
        self._outbox: Coalescer[OutboxRequest, Claim | Recorded | None] = Coalescer(
            self._outbox_group
        )
        figures = metrics if metrics is not None else WorkerMetrics()
        self._figures = {name: figures.destination(name) for name in targets}

    async def attempt(self, delivery_id: str) -> Due | None:
        """Attempt the delivery if it is due and free; returns its next job, if it needs one.
        (A job this attempt's end makes due for the next delivery of its per-key line is not
        returned: the sweeper enqueues it. :meth:`attempt_many`, which the worker uses, returns
        those too.)"""
        slot = await self._slots.take()
        try:
            claimed = await self._outbox.submit(delivery_id)
            assert not isinstance(claimed, Recorded)
            if claimed is None:
                return None
            ended = await self._attempt(claimed, slot)
            return next((d for d in ended.jobs if d.id == delivery_id), None)
        finally:
            slot.free()

    async def attempt_many(self, delivery_ids: Sequence[str]) -> list[Due]:
        """Attempt each delivery that is due and free (concurrently, within the worker's
        slots); returns the next jobs they need. They are claimed together, up front; an
        attempt that fails does not stop the others: the first such error is raised once all
        have finished. An attempt that the database's loss stopped (a connection terminated,
        the server down) or that the store refused (full) is not an error here: it is noted in
        ``writable``, which logs it once per outage, and its delivery waits in the database,
        due (or leased until its lease ends), for the sweepers.

        When an attempt's end lets the next delivery of its per-key line go, that one is
        claimed and attempted next in this call, and so on down the line (up to
        ``line_drain`` of them after each attempt here): a line drains without waiting for
        the queue. The claim keeps every rule of the line (:mod:`relay.outbox.ordering`); should it
        not take the delivery (another worker did, it is no longer free), the line is left to
        whoever holds it. Past ``line_drain``, the next one is returned as its job.

        A job must end within its lease (arq's job timeout), so no attempt starts here later
        than half the lease margin after the call began (on the event loop's clock and on the
        injected one): an attempt that gets no slot by then is not made, its lease is given
        back and it comes back as a job of its own, at its due time (arq runs the oldest
        first); the next of a line is then returned as its job."""
        window = Window(
            asyncio.get_running_loop().time() + self._start_window,
            self._clock() + timedelta(seconds=self._start_window),
        )
        claims = await self._outbox.submit_many(list(delivery_ids))
        results = await asyncio.gather(
            *(
                self._attempt_line(claimed, window)
                for claimed in claims
                if isinstance(claimed, Claim | BaseException)
            ),
            return_exceptions=True,
        )
        errors = [
            r for r in results if isinstance(r, BaseException) and not self._writable.failed(r)
        ]
        next_due = [due for r in results if isinstance(r, list) for due in r]
        if errors:
            raise _with_next(errors[0], next_due)
        return next_due

    async def _attempt_line(self, claimed: Claim | BaseException, window: Window) -> list[Due]:
        """Attempt ``claimed``, then the next of its per-key line that its end lets go, and so
        on, while ``window`` is open and up to ``line_drain`` more; returns the next jobs."""
        if isinstance(claimed, BaseException):
            raise claimed
        for drained in range(self._line_drain + 1):
            more = drained < self._line_drain
            ended = await self._attempt_by(claimed, window, more)
            if ended.claimed_next is None:
                follower = ended.next_in_line
                return [*ended.jobs, follower] if follower is not None else ended.jobs
            claimed = ended.claimed_next
        raise AssertionError("unreachable")  # pragma: no cover

    async def _attempt_by(self, claimed: Claim, window: Window, more: bool = False) -> Ended:
        """Attempt ``claimed`` once it has a slot (none by the window's end: its lease is
        given back); ``more``: the line may go on, while the window is open, with the next
        delivery claimed in the record's transaction."""
        try:
            if self._slots.free_now():
                slot = await self._slots.take()  # at once
            else:
                async with asyncio.timeout_at(window.loop_deadline):
                    slot = await self._slots.take()
        except TimeoutError:
            await self._outbox.submit(Release(claimed))
            delivery = claimed.delivery
            # its own job, due when it was due: ahead of newer jobs in the queue, and the id the
            # sweeper looks for (see :func:`relay.dispatch.jobs.deliver_job_id`)
            return Ended([Due(delivery.id, delivery.attempts, delivery.next_attempt_at)])
        try:
            return await self._attempt(claimed, slot, window if more else None)
        finally:
            slot.free()

    async def _outbox_group(
        self, items: list[OutboxRequest]
    ) -> list[Claim | Recorded | BaseException | None]:
        """One transaction for what the worker's attempts asked meanwhile: the records of those
        that finished (they free leases, update destinations' health and let the next of a
        per-key line go), the releases, then the claims of those about to start. Should it
        fail, each record is retried in a transaction of its own (one bad record cannot fail
        the others), then the rest; but should the database have been lost (a connection
        terminated or reset), the whole group is tried once more, on a new connection, and
        if that fails too every item gets its error (one by one, each would wait for a new
        connection in turn, beyond the leases: what they asked waits in the database)."""
        records = [item for item in items if isinstance(item, AttemptRecord)]
        releases = [item.claimed for item in items if isinstance(item, Release)]
        ids = [item for item in items if isinstance(item, str)]
        recorded: list[Recorded | BaseException]
        claims: list[Claim | BaseException | None]
        try:
            recorded, claims = await self._group_transaction(records, releases, ids)
        except Exception as exc:
            if is_unavailable(exc):
                try:
                    recorded, claims = await self._group_transaction(records, releases, ids)
                except Exception as again:
                    recorded, claims = [again] * len(records), [again] * len(ids)
            elif len(items) == 1 and not isinstance(exc, outbox.LeaseLost):
                raise
            else:
                recorded = [await self._record_alone(record) for record in records]
                try:
                    async with self._engine.begin() as conn:
                        if releases:
                            await outbox.release_on(conn, releases)
                        claims = list(await self._claim_on(conn, ids)) if ids else []
                except Exception as claim_error:
                    claims = [claim_error] * len(ids)
        by_record, by_claim = iter(recorded), iter(claims)
        answers: list[Claim | Recorded | BaseException | None] = []
        for item in items:
            if isinstance(item, AttemptRecord):
                answers.append(next(by_record))
            elif isinstance(item, Release):
                answers.append(None)
            else:
                answers.append(next(by_claim))
        return answers

    async def _group_transaction(
        self, records: list[AttemptRecord], releases: list[Claim], ids: list[str]
    ) -> tuple[list[Recorded | BaseException], list[Claim | BaseException | None]]:
        async with self._engine.begin() as conn:
            recorded = list(await self._record_on(conn, records)) if records else []
            if releases:
                await outbox.release_on(conn, releases)
            claims = list(await self._claim_on(conn, ids)) if ids else []
        if records:
            self._writable.succeeded()
        return list(recorded), list(claims)

    async def _claim_on(self, conn: AsyncConnection, delivery_ids: list[str]) -> list[Claim | None]:
        claims = await outbox.claim_on(conn, delivery_ids, self._clock(), self._lease)
        # the same delivery twice in a group (two of its jobs at once): one attempt only
        return [claims.pop(delivery_id, None) for delivery_id in delivery_ids]

    async def _record_on(
        self, conn: AsyncConnection, records: list[AttemptRecord]
    ) -> list[Recorded]:
        owned = await outbox.record_on(conn, records)
        ended = [
            mine and record.status in (SUCCEEDED, DEAD)
            for record, mine in zip(records, owned, strict=True)
        ]
        finished = [r.claimed.delivery for r, end in zip(records, ended, strict=True) if end]
        lines = await outbox.next_in_line(conn, finished, self._clock()) if finished else {}
        follow = {
            lines[_line(r)].id
            for r, end in zip(records, ended, strict=True)
            if end and r.claim_next and _line(r) in lines
        }
        claims = {}
        if follow:
            claims = await outbox.claim_on(conn, list(follow), self._clock(), self._lease)
        answers = []
        for record, mine, end in zip(records, owned, ended, strict=True):
            after = lines.get(_line(record)) if end else None
            # each claim to one record only (two ends of one line in a group: never in practice)
            taken = claims.pop(after.id, None) if after and record.claim_next else None
            answers.append(Recorded(mine, after, taken))
        return answers

    async def _record_alone(self, record: AttemptRecord) -> Recorded | BaseException:
        try:
            async with self._engine.begin() as conn:
                recorded = (await self._record_on(conn, [record]))[0]
        except Exception as exc:
            return exc
        self._writable.succeeded()
        return recorded

    async def _attempt(self, claimed: Claim, slot: Slot, window: Window | None = None) -> Ended:
        """Attempt a claimed delivery in its ``slot``, which is freed once the answer is in
        (the record waits for its group without holding it); returns its next job and the
        one its end lets go next, if they are needed. While ``window`` is open when the
        record is written, the latter is claimed in the record's transaction."""
        now = self._clock()
        delivery = claimed.delivery
        target = self._targets.get(delivery.destination)
        if target is None:
            await outbox.release(
                self._engine,
                claimed,
                status=HELD,
                next_attempt_at=None,
                error=f"destination {delivery.destination!r} is not configured",
            )
            return Ended([])
        health = _health(claimed.health)
        if health.disabled:
            await outbox.release(
                self._engine,
                claimed,
                status=HELD,
                next_attempt_at=None,
                error="destination disabled after 410 Gone; `relay destinations enable` resumes",
            )
            return Ended([])
        wait = hold_until(health, now)
        if wait is not None:
            if await outbox.release(self._engine, claimed, status=PENDING, next_attempt_at=wait):
                return Ended([Due(delivery.id, delivery.attempts, wait)])
            return Ended([])
        policy = self._policies.get(delivery.policy) or self._policies[FALLBACK_POLICY]
        outcome = await self._send(claimed, target, policy)
        slot.answered()
        return await self._record(claimed, policy, outcome, window)

    async def _send(
        self, claimed: Claim, target: Target, policy: Policy
    ) -> tuple[datetime, Outcome]:
        timeout = target.timeout
        if policy.answer_budget is not None:
            timeout = min(timeout, policy.answer_budget)
        started = self._clock()
        began = time.perf_counter()
        try:
            outcome = await target.destination.deliver(
                Outbound.from_event(claimed.event, attempt=claimed.delivery.attempts + 1),
                timeout=timeout.total_seconds(),
            )
        except Exception as exc:
            outcome = _relay_error(claimed, exc, (time.perf_counter() - began) * 1000)
        return started, outcome

    async def _record(
        self,
        claimed: Claim,
        policy: Policy,
        sent: tuple[datetime, Outcome],
        window: Window | None = None,
    ) -> Ended:
        started, outcome = sent
        delivery = claimed.delivery
        finished = max(self._clock(), started)
        next_at: datetime | None = None
        if outcome.ok:
            status = SUCCEEDED
        elif outcome.gone:
            status = HELD
        else:
            schedule_attempts = delivery.attempts + 1 - delivery.schedule_base
            first = delivery.first_attempt_at or started
            next_at = policy.next_attempt(schedule_attempts, first, finished, self._rng)
            if next_at is not None and outcome.retry_after is not None:
                next_at = retry_after_bounded(next_at, finished, outcome.retry_after)
                deadline = policy.deadline(first)
                if deadline is not None and next_at > deadline:
                    next_at = None
            status = PENDING if next_at is not None else DEAD
        change = _health_change(outcome, policy, finished, claimed.health)
        figures = self._figures[delivery.destination]
        figures.attempted(_attempt_outcome(outcome), outcome.duration_ms / 1000)
        result = AttemptResult(
            started_at=started,
            duration_ms=outcome.duration_ms,
            status_code=outcome.status_code,
            error=storable(outcome.error) if outcome.error else outcome.error,
            response_excerpt=outcome.response_excerpt,
        )
        follow = window is not None and window.open(self._clock())
        health = _OnRows(change) if change else None
        recorded = await self._outbox.submit(
            AttemptRecord(claimed, result, status, next_at, health, claim_next=follow)
        )
        assert isinstance(recorded, Recorded)
        if not recorded.owned:
            log.warning(
                "lease of delivery %s was lost during its attempt (it expired, or an operator "
                "gave the delivery up): the attempt is not recorded",
                delivery.id,
            )
            return Ended([])
        if status == SUCCEEDED:
            figures.lag.observe(max((finished - claimed.event.received_at).total_seconds(), 0.0))
        context = {
            "event_id": delivery.event_id,
            "delivery_id": delivery.id,
            "destination": delivery.destination,
            "attempt": delivery.attempts + 1,
            "status_code": result.status_code,
        }
        if outcome.ok:  # one line per delivery: at debug only
            log.debug(
                "attempt %d of delivery %s to %s succeeded in %.1f ms",
                delivery.attempts + 1,
                delivery.id,
                delivery.destination,
                outcome.duration_ms,
                extra=context,
            )
        else:
            log.info(
                "attempt %d of delivery %s to %s failed: %s; %s",
                delivery.attempts + 1,
                delivery.id,
                delivery.destination,
                result.error or f"HTTP {result.status_code}",
                f"next attempt at {next_at.isoformat()}" if next_at else status,
                extra=context,
            )
        if health is not None:
            health.tell(delivery.destination)
        if status == DEAD:
            log.warning(
                "delivery %s to %s is dead after %s",
                delivery.id,
                delivery.destination,
                counted(delivery.attempts + 1, "attempt"),
            )
        jobs = [Due(delivery.id, delivery.attempts + 1, next_at)] if next_at else []
        return Ended(jobs, recorded.next_in_line, recorded.claimed_next)


class AttemptsFailed(Exception):
    """Some attempts of a batch failed; ``next_due`` holds the next jobs of the others."""

    def __init__(self, cause: BaseException, next_due: list[Due]) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.next_due = next_due


def _with_next(error: BaseException, next_due: list[Due]) -> BaseException:
    if not next_due or not isinstance(error, Exception):
        return error
    failed = AttemptsFailed(error, next_due)
    failed.__cause__ = error
    return failed


def _relay_error(claimed: Claim, exc: Exception, duration_ms: float) -> Outcome:
    """A failed attempt for an error in preparing or making it (an event that cannot be
    rendered, a destination's bug): recorded and retried by policy like any other failure,
    logged once, without a traceback (a deterministic error would repeat it every attempt)."""
    delivery = claimed.delivery
    error = f"relay error: {describe_error(exc)}"[:MAX_ERROR_LENGTH]
    log.warning(
        "attempt %d of delivery %s to %s failed: %s",
        delivery.attempts + 1,
        delivery.id,
        delivery.destination,
        error,
    )
    log.debug("traceback of that attempt of delivery %s", delivery.id, exc_info=exc)
    return Outcome(ok=False, error=error, duration_ms=duration_ms)


def _attempt_outcome(outcome: Outcome) -> str:
    if outcome.ok:
        return SUCCEEDED_ATTEMPT
    return GONE_ATTEMPT if outcome.gone else FAILED_ATTEMPT


def _line(record: AttemptRecord) -> tuple[str, str]:
    delivery = record.claimed.delivery
    return delivery.destination, delivery.order_key


def _health(row: Any) -> DestinationHealth:
    if row is None:
        return DestinationHealth()
    return DestinationHealth(row.consecutive_failures, row.paused_until, row.disabled)


def _unhealthy(row: Any) -> bool:
    return bool(row.consecutive_failures or row.paused_until or row.disabled)


def _health_change(
    outcome: Outcome, policy: Policy, finished: datetime, row: Any
) -> Callable[[DestinationHealth], DestinationHealth] | None:
    """How the attempt changes its destination's health (:func:`after_outcome`), or None when
    it cannot change it: a success at a healthy destination, a failure of this message alone.
    None spares the health row a write."""
    if outcome.ok and not (row is not None and _unhealthy(row)):
        return None
    if not (outcome.ok or outcome.gone or outcome.down):
        return None

    def change(health: DestinationHealth) -> DestinationHealth:
        return after_outcome(health, outcome, policy, finished)

    return change


class _OnRows:
    """A health change applied to a destination's row (an :data:`outbox.HealthChange`), which
    keeps the states it went from and to: under the row's lock, one attempt alone sees a
    transition, and :meth:`tell` logs it once the attempt is recorded (a transaction run again
    applies the change again, and the last run is what was committed)."""

    def __init__(self, change: Callable[[DestinationHealth], DestinationHealth]) -> None:
        self._change = change
        self._went: tuple[DestinationHealth, DestinationHealth] | None = None

    def __call__(self, row: Mapping[str, Any]) -> Mapping[str, Any]:
        current = DestinationHealth(
            row["consecutive_failures"], row["paused_until"], row["disabled"]
        )
        new = self._change(current)
        self._went = (current, new)
        reason = "410 Gone" if new.disabled and not current.disabled else row.get("disabled_reason")
        return {
            "consecutive_failures": new.consecutive_failures,
            "paused_until": new.paused_until,
            "disabled": new.disabled,
            "disabled_reason": reason if new.disabled else None,
        }

    def tell(self, destination: str) -> None:
        """Log the destination's change of state, if the change made one: disabled by a 410,
        paused by the breaker (warnings), working again after a pause (info)."""
        if self._went is None:
            return
        before, after = self._went
        if after.disabled and not before.disabled:
            log.warning(
                "destination %s answered 410 Gone: it is disabled, and its deliveries are "
                "held until `relay destinations enable %s` (or the console) enables it",
                destination,
                destination,
                extra={"destination": destination},
            )
        elif after.paused_until is not None and after.paused_until != before.paused_until:
            log.warning(
                "destination %s paused until %s after %s: its deliveries wait until then",
                destination,
                after.paused_until.isoformat(),
                counted(after.consecutive_failures, "consecutive failure"),
                extra={"destination": destination},
            )
        elif before.paused_until is not None and after.paused_until is None:
            log.info(
                "destination %s works again (it was paused after %s)",
                destination,
                counted(before.consecutive_failures, "consecutive failure"),
                extra={"destination": destination},
            )
