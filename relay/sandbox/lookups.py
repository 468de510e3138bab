"""Number information: the portability check (GNP) and the HLR lookup (GNV).

Without a callbackUrl the result is the answer (``synchronous: true``). With one, the answer
carries the requestId and the result is POSTed there a moment later on the platform's numinfo
schedule (200 within 2 s; retries after 1, 5, 10, 20, 30, 60 min, then hourly, up to 48 h).
A number's operator data are drawn from the number itself, so the same number always gets the
same answer; the magic numbers force ported, not ported and an absent subscriber.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from receivers.kinds import KINDS_BY_NAME
from relay.sandbox import checks, numbers
from relay.sandbox.room import make_room
from relay.sandbox.sandbox import Sandbox
from relay.sandbox.state import Callback, iso
from relay.simulator import factories

PRODUCTS = ("gnp", "gnv")
RESULT_DELAY = timedelta(seconds=1)
"""From the lookup to its result's callback (an assumption: the platform's is not published)."""
ABSENT_ERROR_CODE = "027"
"""GNV's errorCode for an absent subscriber: the simulator's illustrative code (the platform's
values are not published)."""


@dataclass
class Lookup:
    """One GNP or GNV request and its result."""

    request_id: str
    product: str
    msisdn: str
    submitted_at: datetime
    result: dict[str, Any]
    callback_url: str | None = None
    outcome: str = "default"
    callbacks: list[str] = field(default_factory=list)


def lookup(
    sandbox: Sandbox, product: str, fields: dict[str, str], chaos: frozenset[str]
) -> dict[str, Any]:
    """Check a lookup's query, record it, and return the API's answer; with a callbackUrl,
    schedule the result's callback."""
    msisdn = checks.international(fields, "msisdn")
    url = checks.callback_url(fields, "callbackUrl")
    state = sandbox.state
    make_room(state.lookups, state.callbacks, sandbox.settings.max_messages, _done, "lookups")
    row = numbers.BY_NUMBER.get(msisdn)
    outcome = row.outcome if row is not None and row.product == product else "default"
    request_id = str(uuid.uuid4())
    result = number_information(product, msisdn, outcome, synchronous=url is None)
    month = sandbox.clock.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    result["priceEffective"] = iso(month)  # the platform's month, not the machine's
    result["requestId"] = request_id
    record = Lookup(request_id, product, msisdn, sandbox.clock.now(), result, url, outcome)
    sandbox.state.lookups[request_id] = record
    if url is None:
        sandbox.state.changed()
        return result
    kind = f"numinfo.{product}"
    delay = sandbox.settings.chaos.slow_delay if "slow" in chaos else timedelta(0)
    callback = Callback(
        id=str(uuid.uuid4()),
        subject=request_id,
        kind=kind,
        label=f"{product.upper()} {msisdn}",
        url=url,
        method="POST",
        body=result,
        policy=KINDS_BY_NAME[kind].policy_for(result),
        due_at=sandbox.clock.now() + RESULT_DELAY + delay,
        duplicate="duplicate" in chaos,
    )
    record.callbacks.append(callback.id)
    sandbox.scheduler.schedule(callback)
    return {"requestId": request_id, "msisdn": msisdn, "synchronous": False}


def _done(record: Lookup) -> bool:
    """A lookup is done once its callback (if any) is."""
    return True


def number_information(
    product: str, msisdn: str, outcome: str, *, synchronous: bool
) -> dict[str, Any]:
    """A GNP or GNV result for ``msisdn`` (operator data seeded by the number)."""
    rng = random.Random(f"{product}:{msisdn}")
    ported = outcome == "ported"
    if product == "gnp":
        body = factories.numinfo_gnp(ported=ported, rng=rng)
    else:
        body = factories.numinfo_gnv(rng=rng)
        if outcome == "absent-subscriber":
            body |= {"presence": "false", "errorCode": ABSENT_ERROR_CODE}
    body |= {"msisdn": msisdn, "synchronous": synchronous}
    return {k: v for k, v in body.items() if v is not None}


def lookup_json(sandbox: Sandbox, record: Lookup) -> dict[str, Any]:
    """A lookup as the control API and the page show it."""
    return {
        "requestId": record.request_id,
        "product": record.product,
        "msisdn": record.msisdn,
        "outcome": record.outcome,
        "callbackUrl": record.callback_url,
        "result": record.result,
        "callbacks": [
            sandbox.state.callbacks[c].as_json()
            for c in record.callbacks
            if c in sandbox.state.callbacks
        ],
    }
