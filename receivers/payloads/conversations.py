"""Conversations callbacks (v3, and legacy v2 "chat-api"): message status, inbound, other events."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from receivers.payloads.base import PlatformPayload
from receivers.payloads.values import EventName, Flag, Identifier, Integer, Number


class ConversationsEvent(PlatformPayload):
    """Any Conversations callback; other event types (Call::*, Coexistence::*, ...) parse as this.

    ``event`` is stored as received; compare it case-insensitively.
    """

    event: EventName
    message_id: Identifier | None = Field(default=None, alias="messageId")
    channel: str | None = None
    timestamp: str | None = None
    from_: str | None = Field(default=None, alias="from")
    to: str | None = None
    user_context: str | None = Field(default=None, alias="userContext")


class StatusDetails(PlatformPayload):
    """Why a message failed: a channel-specific code and a text."""

    code: str | None = None
    message: str | None = None


class MessageStatus(ConversationsEvent):
    """A ``MessageStatus::*`` event; channel blocks (e.g. ``whatsapp`` pricing) are kept as extras.

    ``status`` is deprecated in v3 (sent on deleted) and always present in v2, which also adds
    ``deliveryChannel``.
    """

    message_id: Identifier = Field(alias="messageId")
    details: StatusDetails | None = None
    status: str | None = None
    delivery_channel: str | None = Field(default=None, alias="deliveryChannel")


class Media(PlatformPayload):
    """A media attachment of an inbound message."""

    type: str | None = None
    url: str | None = None
    media_id: str | None = Field(default=None, alias="mediaId")
    caption: str | None = None


class Location(PlatformPayload):
    """A shared location."""

    latitude: Number | None = None
    longitude: Number | None = None
    name: str | None = None
    address: str | None = None


class Reaction(PlatformPayload):
    """A reaction to an earlier message."""

    message_id: str | None = Field(default=None, alias="messageId")
    emoji: str | None = None


class MoContent(PlatformPayload):
    """The content of an inbound message; ``contentType`` says which part is set."""

    content_type: str | None = Field(default=None, alias="contentType")
    text: str | None = None
    media: Media | None = None
    location: Location | None = None
    contacts: list[Any] | None = None
    reaction: Reaction | None = None


class MoContext(PlatformPayload):
    """What an inbound message refers to (a replied-to message, forwarding flags)."""

    message_id: str | None = Field(default=None, alias="messageId")
    is_forwarded: Flag | None = Field(default=None, alias="isForwarded")


class Postback(PlatformPayload):
    """The payload of a pressed button (``MoMessage::Postback``)."""

    data: str | None = None


class OrderItem(PlatformPayload):
    """One product line of an order."""

    product_retailer_id: str | None = Field(default=None, alias="productRetailerId")
    quantity: Integer | None = None
    item_price: Number | None = Field(default=None, alias="itemPrice")
    currency: str | None = None


class Order(PlatformPayload):
    """A catalog order (``MoMessage::Order``)."""

    catalog_id: str | None = Field(default=None, alias="catalogId")
    text: str | None = None
    items: list[OrderItem] | None = None


class SmsOrigin(PlatformPayload):
    """The network an inbound SMS came from."""

    mcc: str | None = None
    mnc: str | None = None
    tt_id: str | None = Field(default=None, alias="ttId")


class SmsPart(PlatformPayload):
    """One received part of an inbound SMS on the Conversations SMS channel."""

    message_id: str | None = Field(default=None, alias="messageId")
    sent_date: str | None = Field(default=None, alias="sentDate")
    sequence_number: Integer | None = Field(default=None, alias="sequenceNumber")
    price: Number | None = None
    currency: str | None = None
    price_effective: str | None = Field(default=None, alias="priceEffective")


class SmsBlock(PlatformPayload):
    """The ``sms`` channel block of an inbound message."""

    origin: SmsOrigin | None = None
    total_price: Number | None = Field(default=None, alias="totalPrice")
    size: Integer | None = None
    missing_parts: Flag | None = Field(default=None, alias="missingParts")
    parts: list[SmsPart] | None = None


class WhatsAppBlock(PlatformPayload):
    """The ``whatsapp`` channel block of an inbound message."""

    sender_name: str | None = Field(default=None, alias="senderName")


class MoMessage(ConversationsEvent):
    """An inbound message: ``MoMessage``, ``MoMessage::Postback`` or ``MoMessage::Order``.

    Blocks of channels other than ``sms`` and ``whatsapp`` are kept as extras.
    """

    message_id: Identifier = Field(alias="messageId")
    content: MoContent | None = None
    context: MoContext | None = None
    group_id: str | None = Field(default=None, alias="groupId")
    received_at: str | None = Field(default=None, alias="receivedAt")
    postback: Postback | None = None
    order: Order | None = None
    sms: SmsBlock | None = None
    whatsapp: WhatsAppBlock | None = None
