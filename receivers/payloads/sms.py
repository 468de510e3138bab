"""SMS callbacks: inbound messages (``sms.inbound``) and delivery reports (``sms.dlr``)."""

from __future__ import annotations

from pydantic import Field

from receivers.payloads.base import PlatformPayload


class InboundContent(PlatformPayload):
    """One received part of an inbound (possibly concatenated) SMS."""

    msg_id: str = Field(alias="msgId")
    sent_date: str = Field(alias="sentDate")
    sequence_number: int = Field(alias="sequenceNumber")
    price: float | None = None
    currency: str | None = None
    price_effective: str | None = Field(default=None, alias="priceEffective")


class InboundMessage(PlatformPayload):
    """An SMS received on a provisioned number (POST body or GET query parameters)."""

    from_: str = Field(alias="from")
    to: str
    message: str
    request_id: str = Field(alias="requestId")
    origin_mcc: str | None = Field(default=None, alias="originMCC")
    origin_mnc: str | None = Field(default=None, alias="originMNC")
    origin_tt_id: str | None = Field(default=None, alias="originTtId")
    total_price: float | None = Field(default=None, alias="totalPrice")
    size: int | None = None
    missing_parts: bool = Field(default=False, alias="missingParts")
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

    request_id: str = Field(alias="requestId")
    status: str
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
    ttid: int | str | None = Field(default=None, union_mode="left_to_right")
    size: int | None = None
    overall_price: str | None = Field(default=None, alias="overallPrice")
    price_effective: str | None = Field(default=None, alias="priceEffective")
    parts: list[DeliveryReportPart] = Field(default_factory=list)
