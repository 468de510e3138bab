"""Number information callbacks: portability check (GNP) and HLR lookup (GNV) results."""

from __future__ import annotations

from pydantic import Field

from receivers.payloads.base import PlatformPayload
from receivers.payloads.values import Flag, FlagOrText, Identifier, Number


class _NuminfoCommon(PlatformPayload):
    """Fields shared by GNP and GNV results."""

    request_id: Identifier = Field(alias="requestId")
    msisdn: str | None = None
    ported: FlagOrText | None = None
    price: Number | None = None
    currency: str | None = None
    price_effective: str | None = Field(default=None, alias="priceEffective")
    error_code: str | None = Field(default=None, alias="errorCode")
    synchronous: Flag | None = None


class GnpResult(_NuminfoCommon):
    """A portability check result: the operator a number belongs to now."""

    mcc: str | None = None
    mnc: str | None = None
    ttid: str | None = None
    operator: str | None = None
    country: str | None = None
    timezone: str | None = None
    technology: str | None = None


class GnvResult(_NuminfoCommon):
    """An HLR lookup result with its nrh, imsi, hlr and msc network groups."""

    roaming: FlagOrText | None = None
    presence: FlagOrText | None = None

    nrh_mcc: str | None = Field(default=None, alias="nrhMCC")
    nrh_mnc: str | None = Field(default=None, alias="nrhMNC")
    nrh_tt_id: str | None = Field(default=None, alias="nrhTtId")
    nrh_operator: str | None = Field(default=None, alias="nrhOperator")
    nrh_country: str | None = Field(default=None, alias="nrhCountry")
    nrh_time_zone: str | None = Field(default=None, alias="nrhTimeZone")
    nrh_technology: str | None = Field(default=None, alias="nrhTechnology")

    imsi: str | None = None
    imsi_mcc: str | None = Field(default=None, alias="imsiMCC")
    imsi_mnc: str | None = Field(default=None, alias="imsiMNC")
    imsi_tt_id: str | None = Field(default=None, alias="imsiTtId")
    imsi_operator: str | None = Field(default=None, alias="imsiOperator")
    imsi_country: str | None = Field(default=None, alias="imsiCountry")
    imsi_time_zone: str | None = Field(default=None, alias="imsiTimeZone")
    imsi_technology: str | None = Field(default=None, alias="imsiTechnology")

    hlr: str | None = None
    hlr_cc: str | None = Field(default=None, alias="hlrCC")
    hlr_ndc: str | None = Field(default=None, alias="hlrNDC")
    hlr_mcc: str | None = Field(default=None, alias="hlrMCC")
    hlr_mnc: str | None = Field(default=None, alias="hlrMNC")
    hlr_tt_id: str | None = Field(default=None, alias="hlrTtId")
    hlr_operator: str | None = Field(default=None, alias="hlrOperator")
    hlr_country: str | None = Field(default=None, alias="hlrCountry")
    hlr_time_zone: str | None = Field(default=None, alias="hlrTimeZone")
    hlr_technology: str | None = Field(default=None, alias="hlrTechnology")

    msc: str | None = None
    msc_cc: str | None = Field(default=None, alias="mscCC")
    msc_ndc: str | None = Field(default=None, alias="mscNDC")
    msc_mcc: str | None = Field(default=None, alias="mscMCC")
    msc_mnc: str | None = Field(default=None, alias="mscMNC")
    msc_tt_id: str | None = Field(default=None, alias="mscTtId")
    msc_operator: str | None = Field(default=None, alias="mscOperator")
    msc_country: str | None = Field(default=None, alias="mscCountry")
    msc_time_zone: str | None = Field(default=None, alias="mscTimeZone")
    msc_technology: str | None = Field(default=None, alias="mscTechnology")
