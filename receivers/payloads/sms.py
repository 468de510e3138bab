"""SMS callbacks: inbound messages (``sms.inbound``) and delivery reports (``sms.dlr``, in the
current shape and in the legacy shape of the older SMS interface)."""

from __future__ import annotations

from pydantic import Field

from receivers.payloads.base import PlatformPayload
from receivers.payloads.values import Flag, Identifier, Integer, IntegerOrText, Number


class InboundContent(PlatformPayload):
    """One received part of an inbound (possibly concatenated) SMS."""

    msg_id: str = Field(alias="msgId")
    sent_date: str = Field(alias="sentDate")
    sequence_number: Integer = Field(alias="sequenceNumber")
    price: Number | None = None
    currency: str | None = None
    price_effective: str | None = Field(default=None, alias="priceEffective")


class InboundMessage(PlatformPayload):
    """An SMS received on a provisioned number (POST body or GET query parameters)."""

    from_: str = Field(alias="from")
    to: str
    message: str
    request_id: Identifier = Field(alias="requestId")
    origin_mcc: str | None = Field(default=None, alias="originMCC")
    origin_mnc: str | None = Field(default=None, alias="originMNC")
    origin_tt_id: str | None = Field(default=None, alias="originTtId")
    total_price: Number | None = Field(default=None, alias="totalPrice")
    size: Integer | None = None
    missing_parts: Flag = Field(default=False, alias="missingParts")
    content_list: list[InboundContent] = Field(default_factory=list, alias="contentList")


class DeliveryReportPart(PlatformPayload):
    """The delivery record of one part of a sent SMS."""

    part_id: str | None = Field(default=None, alias="partId")
    delivery_state: str | None = Field(default=None, alias="deliveryState")
    done_date: str | None = Field(default=None, alias="doneDate")
    error_code: str | None = Field(default=None, alias="errorCode")
    price: str | None = None
    currency: str | None = None
    price_effective: str | None = Field(default=None, alias="priceEffective")
    status_text: str | None = Field(default=None, alias="statusText")


class DeliveryReport(PlatformPayload):
    """The status of a sent SMS, posted to the send request's callbackUrl.

    ``status`` is kept as received (ACCEPTED, BUFFERED, DELIVERED, EXPIRED, REJECTED,
    UNDELIVERABLE, or any state added later).
    """

    request_id: Identifier = Field(alias="requestId")
    status: Identifier
    reference: str | None = None
    from_: str | None = Field(default=None, alias="from")
    to: str | None = None
    href: str | None = None
    submit_date: str | None = Field(default=None, alias="submitDate")
    sent_date: str | None = Field(default=None, alias="sentDate")
    done_date: str | None = Field(default=None, alias="doneDate")
    error_code: str | None = Field(default=None, alias="errorCode")
    error_reason: str | None = Field(default=None, alias="errorReason")
    mccmnc: str | None = None
    ttid: IntegerOrText | None = None
    size: Integer | None = None
    overall_price: str | None = Field(default=None, alias="overallPrice")
    price_effective: str | None = Field(default=None, alias="priceEffective")
    parts: list[DeliveryReportPart] = Field(default_factory=list)


class LegacyDeliveryReport(PlatformPayload):
    """A delivery report of the platform's older SMS interface, sent to the same URL (usually
    as GET query parameters, also accepted as a JSON body).

    Its own field names are kept, every value as received (query parameters are text; a number
    in a JSON body is stored as its text). ``stat`` is one of delivered, not delivered,
    expired, rejected, buffered (compare it case-insensitively); ``submitdate`` and
    ``donedate`` are Unix seconds.
    """

    msgid: Identifier
    stat: Identifier
    receiver: str | None = None
    sender: str | None = None
    text: str | None = None
    ttid: str | None = None
    mccmnc: str | None = None
    err: str | None = None
    submitdate: str | None = None
    donedate: str | None = None
    price: str | None = None
    currency: str | None = None
    price_effective: str | None = Field(default=None, alias="priceEffective")
