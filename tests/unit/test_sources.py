"""Built-in inbound verifiers: every provider against independently built
signatures (official SDKs where they exist), tampering, rotation and time."""

from __future__ import annotations

import base64
import hashlib
import hmac as std_hmac
import inspect
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import stripe as stripe_sdk
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook

from relaybox import sources
from relaybox.errors import (
    BadSignature,
    ConfigurationError,
    MalformedHeaders,
    MalformedPayload,
    StaleTimestamp,
)
from relaybox.sources import Secret, Source, registry

NOW = 1_700_000_000.0
TOO_FAR = 301  # just over the default 300 s tolerance

Signer = Callable[[str, bytes, float], dict[str, str]]


def compact(payload: Any) -> bytes:
    # Compact bytes: json.dumps(json.loads(body)) adds spaces, so re-serialising changes them.
    return json.dumps(payload, separators=(",", ":")).encode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- independent signers (what each provider really sends) ---------------------


def standard_headers(secret: str, body: bytes, now: float) -> dict[str, str]:
    signature = Webhook(secret).sign("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", _utc(now), body.decode())
    return {
        "webhook-id": "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W",
        "webhook-timestamp": str(int(now)),
        "webhook-signature": signature,
    }


def stripe_headers(secret: str, body: bytes, now: float) -> dict[str, str]:
    header = stripe_sdk.WebhookSignature.generate_signature_header(
        body.decode(), secret, timestamp=int(now)
    )
    return {"stripe-signature": header}


def github_headers(secret: str, body: bytes, now: float) -> dict[str, str]:
    digest = std_hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "x-hub-signature-256": f"sha256={digest}",
        "x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "x-github-event": "issues",
    }


def shopify_headers(secret: str, body: bytes, now: float) -> dict[str, str]:
    digest = std_hmac.new(secret.encode(), body, hashlib.sha256).digest()
    return {
        "x-shopify-hmac-sha256": b64(digest),
        "x-shopify-event-id": "98880550-7158-44d4-b7cd-2c97c8a091b5",
        "x-shopify-webhook-id": "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
        "x-shopify-topic": "orders/create",
        "x-shopify-shop-domain": "shop-a.myshopify.com",
        "x-shopify-api-version": "2024-10",
        "x-shopify-triggered-at": "2023-11-14T22:13:20.000Z",
    }


def slack_headers(secret: str, body: bytes, now: float) -> dict[str, str]:
    base = f"v0:{int(now)}:".encode() + body
    digest = std_hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {"x-slack-signature": f"v0={digest}", "x-slack-request-timestamp": str(int(now))}


def hmac_headers(secret: str, body: bytes, now: float) -> dict[str, str]:
    signed = f"{int(now)}.".encode() + body
    digest = std_hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return {"x-signature": f"sha256={digest}", "x-timestamp": str(int(now))}


def _utc(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


def _standard_secret(seed: bytes) -> str:
    return "whsec_" + b64(hashlib.sha256(seed).digest()[:24])


# -- one case per provider ------------------------------------------------------


@dataclass(frozen=True)
class Case:
    provider: str
    make: Callable[..., Source]
    old: str
    new: str
    body: bytes
    sign: Signer
    signature_header: str
    event_id: str
    event_type: str
    account: str | None
    timed: bool


CASES = [
    Case(
        provider="standard",
        make=sources.standard,
        old=_standard_secret(b"old"),
        new=_standard_secret(b"new"),
        body=compact({"type": "invoice.paid", "timestamp": "2023-11-14T22:13:20Z", "data": {}}),
        sign=standard_headers,
        signature_header="webhook-signature",
        event_id="msg_2KWPBgLlAfxdpx2AI54pPJ85f4W",
        event_type="invoice.paid",
        account=None,
        timed=True,
    ),
    Case(
        provider="stripe",
        make=sources.stripe,
        old="whsec_old_0123456789abcdef",
        new="whsec_new_0123456789abcdef",
        body=compact(
            {"id": "evt_1", "object": "event", "type": "charge.succeeded", "account": "acct_9"}
        ),
        sign=stripe_headers,
        signature_header="stripe-signature",
        event_id="evt_1",
        event_type="charge.succeeded",
        account="acct_9",
        timed=True,
    ),
    Case(
        provider="github",
        make=sources.github,
        old="old github secret",
        new="new github secret",
        body=compact({"action": "opened", "issue": {"number": 1}, "installation": {"id": 42}}),
        sign=github_headers,
        signature_header="x-hub-signature-256",
        event_id="72d3162e-cc78-11e3-81ab-4c9367dc0958",
        event_type="issues.opened",
        account="42",
        timed=False,
    ),
    Case(
        provider="shopify",
        make=sources.shopify,
        old="shpss_old",
        new="shpss_new",
        body=compact({"id": 820982911946154508, "total_price": "10.00"}),
        sign=shopify_headers,
        signature_header="x-shopify-hmac-sha256",
        event_id="98880550-7158-44d4-b7cd-2c97c8a091b5",
        event_type="orders/create",
        account="shop-a.myshopify.com",
        timed=False,
    ),
    Case(
        provider="slack",
        make=sources.slack,
        old="8f742231b10e8888abcd99yyyzzz85a5",
        new="9e853342c21f9999bcde00zzzaaa96b6",
        body=compact(
            {
                "type": "event_callback",
                "event_id": "Ev08MFMKH6",
                "team_id": "T0001",
                "event": {"type": "app_mention", "text": "hi"},
            }
        ),
        sign=slack_headers,
        signature_header="x-slack-signature",
        event_id="Ev08MFMKH6",
        event_type="app_mention",
        account="T0001",
        timed=True,
    ),
    Case(
        provider="hmac",
        make=lambda **kw: sources.hmac(
            header="X-Signature",
            prefix="sha256=",
            signed="{timestamp}.{body}",
            timestamp_header="X-Timestamp",
            id_path="data.order.id",
            type_path="event",
            account_path="merchant",
            **kw,
        ),
        old="generic-old",
        new="generic-new",
        body=compact({"event": "order.paid", "merchant": "m_1", "data": {"order": {"id": "o_1"}}}),
        sign=hmac_headers,
        signature_header="x-signature",
        event_id="o_1",
        event_type="order.paid",
        account="m_1",
        timed=True,
    ),
]
TIMED = [c for c in CASES if c.timed]
UNTIMED = [c for c in CASES if not c.timed]


def cases(selection: list[Case] = CASES) -> Any:
    return pytest.mark.parametrize("case", selection, ids=[c.provider for c in selection])


def flip(body: bytes, index: int = 3) -> bytes:
    return body[:index] + bytes([body[index] ^ 0x01]) + body[index + 1 :]


# -- every provider -------------------------------------------------------------


@cases()
def test_valid_delivery_verifies(case: Case) -> None:
    source = case.make(secrets=[case.new])
    verified = source.verify(case.sign(case.new, case.body, NOW), case.body, NOW)
    assert verified.source == case.provider
    assert verified.event_id == case.event_id
    assert verified.event_type == case.event_type
    assert verified.account == (case.account or "default")
    assert verified.payload == json.loads(case.body)
    assert verified.fingerprint == hashlib.sha256(case.body).digest()
    assert verified.timestamp == (NOW if case.timed else None)


@cases()
def test_one_byte_change_fails(case: Case) -> None:
    source = case.make(secrets=[case.new])
    headers = case.sign(case.new, case.body, NOW)
    with pytest.raises(BadSignature):
        source.verify(headers, flip(case.body), NOW)


@cases()
def test_reserialised_json_fails(case: Case) -> None:
    source = case.make(secrets=[case.new])
    headers = case.sign(case.new, case.body, NOW)
    reserialised = json.dumps(json.loads(case.body)).encode()
    assert reserialised != case.body
    with pytest.raises(BadSignature):
        source.verify(headers, reserialised, NOW)


@cases()
def test_missing_signature_header(case: Case) -> None:
    source = case.make(secrets=[case.new])
    headers = case.sign(case.new, case.body, NOW)
    del headers[case.signature_header]
    with pytest.raises(BadSignature) as info:
        source.verify(headers, case.body, NOW)
    assert info.value.code == "missing_signature"
    assert info.value.status == 401


@cases()
def test_wrong_secret_fails_without_leaking(case: Case) -> None:
    source = case.make(secrets=[case.old])
    headers = case.sign(case.new, case.body, NOW)
    with pytest.raises(BadSignature) as info:
        source.verify(headers, case.body, NOW)
    assert case.old not in info.value.message
    assert case.new not in info.value.message
    assert headers[case.signature_header] not in info.value.message


@cases()
@pytest.mark.parametrize("signed_with", ["old", "new"])
def test_rotation_matches_either_secret_and_its_tenant(case: Case, signed_with: str) -> None:
    old = Secret(case.old, account="acct_old", tenant="tenant_old")
    new = Secret(case.new, account="acct_new", tenant="tenant_new")
    source = case.make(secrets=[old, new])
    value = case.old if signed_with == "old" else case.new
    verified = source.verify(case.sign(value, case.body, NOW), case.body, NOW)
    assert verified.account == f"acct_{signed_with}"
    assert verified.tenant == f"tenant_{signed_with}"
    assert source.authenticate(case.sign(value, case.body, NOW), case.body, NOW, True)[0] == (
        old if signed_with == "old" else new
    )


@cases([c for c in CASES if c.account is not None])
def test_account_maps_to_tenant(case: Case) -> None:
    assert case.account is not None
    source = case.make(secrets=[case.new], tenants={case.account: "tenant_x"})
    verified = source.verify(case.sign(case.new, case.body, NOW), case.body, NOW)
    assert (verified.account, verified.tenant) == (case.account, "tenant_x")


@cases(TIMED)
@pytest.mark.parametrize("offset", [-TOO_FAR, TOO_FAR], ids=["old", "future"])
def test_timestamp_outside_tolerance(case: Case, offset: int) -> None:
    source = case.make(secrets=[case.new])
    headers = case.sign(case.new, case.body, NOW + offset)
    with pytest.raises(StaleTimestamp):
        source.verify(headers, case.body, NOW)
    # Replays of stored deliveries skip the time check, not the signature check.
    assert source.verify(headers, case.body, NOW, check_time=False).event_id == case.event_id
    with pytest.raises(BadSignature):
        source.verify(headers, flip(case.body), NOW, check_time=False)


@cases(TIMED)
def test_verify_timestamp_false_accepts_old(case: Case) -> None:
    source = case.make(secrets=[case.new], verify_timestamp=False)
    headers = case.sign(case.new, case.body, NOW - 86_400)
    assert source.verify(headers, case.body, NOW).timestamp == NOW - 86_400


@cases(TIMED)
def test_tolerance_edge_is_inclusive(case: Case) -> None:
    source = case.make(secrets=[case.new], tolerance=60)
    for offset in (-60, 60):
        source.verify(case.sign(case.new, case.body, NOW + offset), case.body, NOW)


@cases(UNTIMED)
def test_untimed_providers_ignore_time(case: Case) -> None:
    source = case.make(secrets=[case.new])
    headers = case.sign(case.new, case.body, NOW - 10**6)
    assert source.verify(headers, case.body, NOW).timestamp is None


@cases()
def test_sign_round_trip(case: Case) -> None:
    old = Secret(case.old, tenant="t_old")
    source = case.make(secrets=[Secret(case.new), old])
    for secret in (None, old):
        headers = source.sign(
            case.body, event_id=case.event_id, event_type=case.event_type, now=NOW, secret=secret
        )
        verified = source.verify(headers, case.body, NOW)
        assert verified.event_id == case.event_id
        assert verified.event_type == case.event_type
        assert verified.tenant == (secret.tenant if secret else None)


@cases()
def test_sign_matches_independent_signer(case: Case) -> None:
    source = case.make(secrets=[case.new])
    ours = source.sign(case.body, event_id=case.event_id, event_type=case.event_type, now=NOW)
    theirs = case.sign(case.new, case.body, NOW)
    assert ours[case.signature_header] == theirs[case.signature_header]


@cases()
def test_example_round_trip(case: Case) -> None:
    source = case.make(secrets=[case.new])
    body = source.example(case.event_type, "evt_example_1", NOW)
    headers = source.sign(body, event_id="evt_example_1", event_type=case.event_type, now=NOW)
    verified = source.verify(headers, body, NOW)
    assert verified.event_id == "evt_example_1"
    assert verified.event_type == case.event_type


@cases()
def test_example_without_type_round_trip(case: Case) -> None:
    # `relaybox send-test` without --type: example(None) then sign(event_type="").
    source = case.make(secrets=[case.new])
    body = source.example(None, "evt_example_2", NOW)
    headers = source.sign(body, event_id="evt_example_2", event_type="", now=NOW)
    verified = source.verify(headers, body, NOW)
    assert verified.event_id == "evt_example_2"
    assert verified.event_type


@cases()
def test_non_json_body_is_malformed_after_verification(case: Case) -> None:
    source = case.make(secrets=[case.new])
    body = b"not json"
    with pytest.raises(MalformedPayload):
        source.verify(case.sign(case.new, body, NOW), body, NOW)


@cases()
def test_single_string_secret_is_one_secret(case: Case) -> None:
    assert len(case.make(secrets=case.new).secrets) == 1


@cases()
def test_empty_secret_is_refused(case: Case) -> None:
    with pytest.raises(ConfigurationError):
        case.make(secrets=[""])
    with pytest.raises(ConfigurationError):  # blank: no sender signs with that
        case.make(secrets=[case.new, "  "])


@pytest.mark.parametrize("case", CASES, ids=[c.provider for c in CASES])
@settings(max_examples=50, deadline=None, database=None)
@given(body=st.binary(max_size=256), data=st.data())
def test_property_sign_verify_and_any_byte_flip(case: Case, body: bytes, data: Any) -> None:
    source = case.make(secrets=[case.new])
    headers = source.sign(body, event_id="evt_p", event_type=case.event_type, now=NOW)
    secret, _ = source.authenticate(headers, body, NOW, True)
    assert secret.value == case.new
    if body:
        index = data.draw(st.integers(0, len(body) - 1))
        delta = data.draw(st.integers(1, 255))
        mutated = body[:index] + bytes([body[index] ^ delta]) + body[index + 1 :]
        with pytest.raises(BadSignature):
            source.authenticate(headers, mutated, NOW, True)
    with pytest.raises(BadSignature):
        source.authenticate(headers, body + b"\x00", NOW, True)


# -- Standard Webhooks ------------------------------------------------------------

STD = CASES[0]


def test_standard_sign_passes_reference_library() -> None:
    source = sources.standard(secrets=[STD.new])
    now = time.time()
    headers = source.sign(STD.body, event_id="msg_1", event_type="invoice.paid", now=now)
    assert Webhook(STD.new).verify(STD.body, headers) == json.loads(STD.body)


def test_standard_svix_header_names() -> None:
    source = sources.standard(secrets=[STD.new])
    headers = {
        k.replace("webhook-", "svix-"): v for k, v in STD.sign(STD.new, STD.body, NOW).items()
    }
    verified = source.verify(headers, STD.body, NOW)
    assert verified.event_id == STD.event_id
    del headers["svix-signature"]
    with pytest.raises(BadSignature, match="svix-signature") as info:
        source.verify(headers, STD.body, NOW)
    assert info.value.code == "missing_signature"


def test_standard_secret_without_prefix() -> None:
    source = sources.standard(secrets=[STD.new.removeprefix("whsec_")])
    source.verify(STD.sign(STD.new, STD.body, NOW), STD.body, NOW)


def test_standard_several_signatures_in_header() -> None:
    source = sources.standard(secrets=[STD.new])
    headers = STD.sign(STD.new, STD.body, NOW)
    other = STD.sign(STD.old, STD.body, NOW)["webhook-signature"]
    headers["webhook-signature"] = f"v2,abc {other} garbage {headers['webhook-signature']}"
    source.verify(headers, STD.body, NOW)


@pytest.mark.parametrize(
    ("header", "value"),
    [("webhook-id", None), ("webhook-timestamp", None), ("webhook-timestamp", "soon")],
)
def test_standard_malformed_headers(header: str, value: str | None) -> None:
    source = sources.standard(secrets=[STD.new])
    headers = STD.sign(STD.new, STD.body, NOW)
    if value is None:
        del headers[header]
    else:
        headers[header] = value
    with pytest.raises(MalformedHeaders) as info:
        source.verify(headers, STD.body, NOW)
    assert info.value.status == 400


def test_standard_missing_type_is_malformed_payload() -> None:
    source = sources.standard(secrets=[STD.new])
    body = compact({"data": {}})
    with pytest.raises(MalformedPayload):
        source.verify(STD.sign(STD.new, body, NOW), body, NOW)


def _ed25519_pair() -> tuple[Ed25519PrivateKey, str, str]:
    private = Ed25519PrivateKey.generate()
    whsk = "whsk_" + b64(private.private_bytes_raw())
    whpk = "whpk_" + b64(private.public_key().public_bytes_raw())
    return private, whsk, whpk


def test_standard_v1a_ed25519() -> None:
    private, whsk, whpk = _ed25519_pair()
    content = f"msg_ed.{int(NOW)}.".encode() + STD.body
    good = b64(private.sign(content))
    bad = b64(std_hmac.new(b"someone else", content, hashlib.sha256).digest())
    headers = {
        "webhook-id": "msg_ed",
        "webhook-timestamp": str(int(NOW)),
        "webhook-signature": f"v1,{bad} v1a,{good}",
    }
    verifier = sources.standard(secrets=[Secret(whpk, account="acct_ed")])
    verified = verifier.verify(headers, STD.body, NOW)
    assert (verified.event_id, verified.account) == ("msg_ed", "acct_ed")
    with pytest.raises(BadSignature):
        verifier.verify(headers, flip(STD.body), NOW)
    # A v1a signature is not accepted under the v1 label, nor by another key.
    headers["webhook-signature"] = f"v1,{good}"
    with pytest.raises(BadSignature):
        verifier.verify(headers, STD.body, NOW)
    headers["webhook-signature"] = f"v1a,{good}"
    with pytest.raises(BadSignature):
        sources.standard(secrets=[_ed25519_pair()[2]]).verify(headers, STD.body, NOW)
    # The private key signs (send-test) and verifies through its derived public key.
    signer = sources.standard(secrets=[whsk])
    signed = signer.sign(STD.body, event_id="msg_2", event_type="invoice.paid", now=NOW)
    assert signed["webhook-signature"].startswith("v1a,")
    assert verifier.verify(signed, STD.body, NOW).event_id == "msg_2"
    assert signer.verify(signed, STD.body, NOW).event_id == "msg_2"


def test_standard_mixed_hmac_and_ed25519_rotation() -> None:
    _, whsk, whpk = _ed25519_pair()
    source = sources.standard(secrets=[Secret(STD.old, tenant="hmac"), Secret(whpk, tenant="ed")])
    signer = sources.standard(secrets=[whsk])
    signed = signer.sign(STD.body, event_id="m", event_type="t", now=NOW)
    assert source.verify(signed, STD.body, NOW).tenant == "ed"
    assert source.verify(STD.sign(STD.old, STD.body, NOW), STD.body, NOW).tenant == "hmac"
    with pytest.raises(ConfigurationError):
        sources.standard(secrets=[whpk]).sign(STD.body, event_id="m", event_type="t", now=NOW)


@pytest.mark.parametrize("value", ["whsec_not base64!", "whpk_" + b64(b"short"), "whsk_%%%"])
def test_standard_bad_secret_is_configuration_error(value: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        sources.standard(secrets=[value])
    assert value not in str(info.value)


# -- Stripe -----------------------------------------------------------------------

STRIPE = CASES[1]


def test_stripe_sign_accepted_by_official_library() -> None:
    source = sources.stripe(secrets=[STRIPE.new])
    now = time.time()
    headers = source.sign(STRIPE.body, event_id="evt_1", event_type="charge.succeeded", now=now)
    event = stripe_sdk.Webhook.construct_event(STRIPE.body, headers["stripe-signature"], STRIPE.new)
    assert event.id == "evt_1"


def test_stripe_compute_signature_vector() -> None:
    t = int(NOW)
    v1 = stripe_sdk.WebhookSignature._compute_signature(f"{t}.{STRIPE.body.decode()}", STRIPE.new)
    stale = stripe_sdk.WebhookSignature._compute_signature(f"{t}.{{}}", STRIPE.new)
    # Two v1 while Stripe rolls the endpoint secret, plus a v0 to ignore.
    header = f"t={t},v1={stale},v1={v1},v0={'0' * 64}"
    verified = sources.stripe(secrets=[STRIPE.new]).verify(
        {"stripe-signature": header}, STRIPE.body, NOW
    )
    assert (verified.event_id, verified.account) == ("evt_1", "acct_9")


@pytest.mark.parametrize(
    ("header", "error"),
    [
        ("v1=abc", MalformedHeaders),
        ("t=soon,v1=abc", MalformedHeaders),
        (f"t={int(NOW)},v0=abc", BadSignature),
        (f"t={int(NOW)},v1=", BadSignature),
    ],
)
def test_stripe_malformed_header(header: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        sources.stripe(secrets=[STRIPE.new]).verify({"stripe-signature": header}, STRIPE.body, NOW)


def test_stripe_event_without_id_is_malformed_payload() -> None:
    body = compact({"object": "event", "type": "charge.succeeded"})
    with pytest.raises(MalformedPayload) as info:
        sources.stripe(secrets=[STRIPE.new]).verify(STRIPE.sign(STRIPE.new, body, NOW), body, NOW)
    assert info.value.code == "missing_event_id"


def test_stripe_platform_event_has_no_account() -> None:
    body = compact({"id": "evt_2", "type": "charge.succeeded", "api_version": "2024-06-20"})
    source = sources.stripe(secrets=[STRIPE.new], account="platform")
    verified = source.verify(STRIPE.sign(STRIPE.new, body, NOW), body, NOW)
    assert (verified.account, verified.version) == ("platform", "2024-06-20")


# -- GitHub -----------------------------------------------------------------------

GH = CASES[2]


def test_github_documented_vector() -> None:
    source = sources.github(secrets=["It's a Secret to Everybody"])
    headers = {
        "x-hub-signature-256": (
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        )
    }
    secret, timestamp = source.authenticate(headers, b"Hello, World!", NOW, True)
    assert (secret.value, timestamp) == ("It's a Secret to Everybody", None)
    with pytest.raises(BadSignature):
        source.authenticate(headers, b"Hello, World?", NOW, True)
    signed = source.sign(b"Hello, World!", event_id="d", event_type="ping", now=NOW)
    assert signed["x-hub-signature-256"] == headers["x-hub-signature-256"]


def test_github_legacy_sha1_header_is_not_enough() -> None:
    headers = GH.sign(GH.new, GH.body, NOW)
    legacy = headers.pop("x-hub-signature-256").replace("sha256=", "sha1=")
    with pytest.raises(BadSignature) as info:
        sources.github(secrets=[GH.new]).verify(
            {**headers, "x-hub-signature": legacy}, GH.body, NOW
        )
    assert info.value.code == "missing_signature"


@pytest.mark.parametrize(
    ("payload", "event_type", "account"),
    [
        ({"zen": "Keep it logically awesome."}, "issues", None),
        (
            {"action": "closed", "repository": {"owner": {"login": "octo-org"}}},
            "issues.closed",
            "octo-org",
        ),
        ({"action": "added", "organization": {"login": "octo-org"}}, "issues.added", "octo-org"),
        ({"installation": {"id": 7}, "repository": {"owner": {"login": "x"}}}, "issues", "7"),
    ],
)
def test_github_identity(payload: dict[str, Any], event_type: str, account: str | None) -> None:
    body = compact(payload)
    verified = sources.github(secrets=[GH.new]).verify(GH.sign(GH.new, body, NOW), body, NOW)
    assert (verified.event_type, verified.account) == (event_type, account or "default")


@pytest.mark.parametrize("header", ["x-github-delivery", "x-github-event"])
def test_github_missing_identity_header(header: str) -> None:
    headers = GH.sign(GH.new, GH.body, NOW)
    del headers[header]
    with pytest.raises(MalformedHeaders):
        sources.github(secrets=[GH.new]).verify(headers, GH.body, NOW)


# -- Shopify ----------------------------------------------------------------------

SHOP = CASES[3]


def test_shopify_webhook_id_fallback_and_version() -> None:
    headers = SHOP.sign(SHOP.new, SHOP.body, NOW)
    del headers["x-shopify-event-id"]
    verified = sources.shopify(secrets=[SHOP.new]).verify(headers, SHOP.body, NOW)
    assert verified.event_id == "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"
    assert verified.version == "2024-10"


def test_shopify_per_shop_secret_wins_over_unsigned_domain_header() -> None:
    headers = SHOP.sign(SHOP.new, SHOP.body, NOW)
    headers["x-shopify-shop-domain"] = "victim.myshopify.com"  # not covered by the HMAC
    source = sources.shopify(secrets=[Secret(SHOP.new, account="shop-a.myshopify.com")])
    assert source.verify(headers, SHOP.body, NOW).account == "shop-a.myshopify.com"


@pytest.mark.parametrize("header", ["x-shopify-topic", "x-shopify-event-id"])
def test_shopify_missing_identity_header(header: str) -> None:
    headers = SHOP.sign(SHOP.new, SHOP.body, NOW)
    del headers[header]
    headers.pop("x-shopify-webhook-id")
    with pytest.raises(MalformedHeaders):
        sources.shopify(secrets=[SHOP.new]).verify(headers, SHOP.body, NOW)


# -- Slack ------------------------------------------------------------------------

SLACK = CASES[4]


def test_slack_documented_signature_shape() -> None:
    # Slack's docs: basestring "v0:" + timestamp + ":" + body, hex, "v0=" prefix.
    headers = sources.slack(secrets=[SLACK.new]).sign(
        b"token=x", event_id="", event_type="", now=NOW
    )
    expected = std_hmac.new(SLACK.new.encode(), b"v0:1700000000:token=x", hashlib.sha256)
    assert headers["x-slack-signature"] == "v0=" + expected.hexdigest()


def test_slack_url_verification() -> None:
    body = compact({"token": "t", "challenge": "3eZbrw1aB", "type": "url_verification"})
    verified = sources.slack(secrets=[SLACK.new]).verify(
        SLACK.sign(SLACK.new, body, NOW), body, NOW
    )
    assert (verified.event_id, verified.event_type) == (
        "url_verification:3eZbrw1aB",
        "url_verification",
    )


def test_slack_app_rate_limited_and_envelope_type() -> None:
    source = sources.slack(secrets=[SLACK.new])
    body = compact({"type": "app_rate_limited", "team_id": "T1", "minute_rate_limited": 1518467820})
    verified = source.verify(SLACK.sign(SLACK.new, body, NOW), body, NOW)
    assert verified.event_id == "app_rate_limited:T1:1518467820"
    body = compact({"type": "event_callback", "event_id": "Ev1", "team_id": "T1"})
    assert source.verify(SLACK.sign(SLACK.new, body, NOW), body, NOW).event_type == (
        "event_callback"
    )


def test_slack_form_encoded_interactivity_is_decoded() -> None:
    # Interactivity is form-encoded (payload=<JSON>): decoded, not refused.
    body = b"payload=%7B%22type%22%3A%22block_actions%22%2C%22trigger_id%22%3A%22t1%22%7D"
    source = sources.slack(secrets=[SLACK.new])
    verified = source.verify(SLACK.sign(SLACK.new, body, NOW), body, NOW)
    assert (verified.event_type, verified.event_id) == ("block_actions", "t1")


def test_slack_missing_event_id() -> None:
    body = compact({"type": "event_callback", "event": {"type": "message"}})
    with pytest.raises(MalformedPayload):
        sources.slack(secrets=[SLACK.new]).verify(SLACK.sign(SLACK.new, body, NOW), body, NOW)


@pytest.mark.parametrize("value", [None, "yesterday"])
def test_slack_bad_timestamp_header(value: str | None) -> None:
    headers = SLACK.sign(SLACK.new, SLACK.body, NOW)
    if value is None:
        del headers["x-slack-request-timestamp"]
    else:
        headers["x-slack-request-timestamp"] = value
    with pytest.raises(MalformedHeaders):
        sources.slack(secrets=[SLACK.new]).verify(headers, SLACK.body, NOW)


# -- generic HMAC -----------------------------------------------------------------

GEN = CASES[5]


def test_hmac_missing_timestamp_header() -> None:
    headers = GEN.sign(GEN.new, GEN.body, NOW)
    del headers["x-timestamp"]
    with pytest.raises(MalformedHeaders):
        GEN.make(secrets=[GEN.new]).verify(headers, GEN.body, NOW)


def test_hmac_milliseconds_timestamp() -> None:
    source = GEN.make(secrets=[GEN.new])
    millis = str(int(NOW * 1000))
    signed = f"{millis}.".encode() + GEN.body
    digest = std_hmac.new(GEN.new.encode(), signed, hashlib.sha256).hexdigest()
    headers = {"x-signature": f"sha256={digest}", "x-timestamp": millis}
    assert source.verify(headers, GEN.body, NOW).timestamp == NOW
    with pytest.raises(StaleTimestamp):
        source.verify(headers, GEN.body, NOW + TOO_FAR)


def test_hmac_sha512_base64_body_only_with_header_identity() -> None:
    source = sources.hmac(
        secrets=["k"],
        header="X-Sig",
        algorithm="sha512",
        encoding="base64",
        id_path="header:X-Event-Id",
        type_path="header:X-Event-Type",
        account_path="header:X-Account",
    )
    body = b'{"anything":1}'
    digest = std_hmac.new(b"k", body, hashlib.sha512).digest()
    headers = {
        "x-sig": b64(digest),
        "x-event-id": "e1",
        "x-event-type": "thing.done",
        "x-account": "a1",
    }
    verified = source.verify(headers, body, NOW)
    assert (verified.event_id, verified.event_type, verified.account) == ("e1", "thing.done", "a1")
    assert verified.timestamp is None
    del headers["x-event-id"]
    with pytest.raises(MalformedHeaders):
        source.verify(headers, body, NOW)
    headers["x-sig"] = "not base64!"
    with pytest.raises(BadSignature):
        source.verify(headers, body, NOW)


def test_hmac_id_in_template() -> None:
    source = sources.hmac(
        secrets=["k"],
        header="Sig",
        signed="{id}:{timestamp}:{body}",
        timestamp_header="Ts",
        id_path="header:Msg-Id",
    )
    body = b'{"type":"a"}'
    signed = f"m1:{int(NOW)}:".encode() + body
    headers = {
        "sig": std_hmac.new(b"k", signed, hashlib.sha256).hexdigest(),
        "ts": str(int(NOW)),
        "msg-id": "m1",
    }
    assert source.verify(headers, body, NOW).event_id == "m1"
    headers["msg-id"] = "m2"  # the id is signed: swapping it breaks the signature
    with pytest.raises(BadSignature):
        source.verify(headers, body, NOW)
    assert source.sign(body, event_id="m1", event_type="a", now=NOW) == {
        **headers,
        "msg-id": "m1",
    }


def test_hmac_resent_envelope_keeps_event_key_and_fingerprint() -> None:
    # A payment provider wraps the same order in a fresh envelope on every resend.
    source = sources.hmac(
        secrets=["k"],
        header="X-Sig",
        id_path="data.order.id",
        type_path="event",
        fingerprint_path="data",
    )
    order = {"order": {"id": "ord_77", "status": "paid", "amount": 1200}}
    first = compact({"notification_id": "n1", "sent_at": 1, "event": "order.paid", "data": order})
    second = compact({"sent_at": 9, "notification_id": "n2", "event": "order.paid", "data": order})
    one = source.verify(source.sign(first, event_id="", event_type="", now=NOW), first, NOW)
    two = source.verify(source.sign(second, event_id="", event_type="", now=NOW), second, NOW)
    assert one.event_id == two.event_id == "ord_77"
    assert one.fingerprint == two.fingerprint
    changed = compact({"event": "order.paid", "data": {"order": {**order["order"], "amount": 1}}})
    three = source.verify(source.sign(changed, event_id="", event_type="", now=NOW), changed, NOW)
    assert three.event_id == "ord_77" and three.fingerprint != one.fingerprint


def test_hmac_missing_id_and_type_in_payload() -> None:
    source = GEN.make(secrets=[GEN.new])
    for payload, code in [
        ({"event": "order.paid", "data": {}}, "missing_event_id"),
        ({"data": {"order": {"id": "o"}}}, "missing_event_type"),
    ]:
        body = compact(payload)
        with pytest.raises(MalformedPayload) as info:
            source.verify(GEN.sign(GEN.new, body, NOW), body, NOW)
        assert info.value.code == code


@pytest.mark.parametrize(
    "options",
    [
        {"algorithm": "md5"},
        {"encoding": "base32"},
        {"signed": "{timestamp}.{body}"},  # no timestamp_header
        {"signed": "{id}.{body}"},  # id_path is not a header
        {"signed": "{timestamp}"},  # no body
        {"signed": "{body}{body}"},
        {"signed": "{nonce}.{body}"},
        {"signed": "{body"},
    ],
)
def test_hmac_bad_options(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        sources.hmac(secrets=["k"], header="X-Sig", id_path="id", **options)


def test_hmac_literal_braces_in_template() -> None:
    source = sources.hmac(secrets=["k"], header="S", id_path="id", signed="{{v1}}{body}")
    body = b'{"id":"1","type":"t"}'
    digest = std_hmac.new(b"k", b"{v1}" + body, hashlib.sha256).hexdigest()
    assert source.verify({"s": digest}, body, NOW).event_id == "1"


# -- from_config ------------------------------------------------------------------


def test_from_config_builds_every_provider() -> None:
    for case in CASES:
        options: dict[str, Any] = {
            "secrets": [case.old, {"value": case.new, "account": "a_new", "tenant": "t_new"}],
            "tolerance": 120,
            "name": f"{case.provider}-main",
        }
        if case.provider == "hmac":
            options.update(
                header="X-Signature",
                prefix="sha256=",
                signed="{timestamp}.{body}",
                timestamp_header="X-Timestamp",
                id_path="data.order.id",
                type_path="event",
                account_path="merchant",
            )
        source = sources.from_config(case.provider, options)
        assert source.provider == case.provider
        assert source.tolerance == 120
        verified = source.verify(case.sign(case.new, case.body, NOW), case.body, NOW)
        assert (verified.source, verified.account, verified.tenant) == (
            f"{case.provider}-main",
            "a_new",
            "t_new",
        )


@pytest.mark.parametrize(
    ("provider", "options", "message"),
    [
        ("paypal", {"secrets": ["x"]}, "unknown source provider 'paypal'"),
        ("stripe", {"secrets": ["whsec_x"], "tolerence": 5}, "unknown option 'tolerence'"),
        ("stripe", {}, "needs 'secrets'"),
        ("stripe", {"secrets": []}, "non-empty list"),
        ("stripe", {"secrets": [{"value": "whsec_x", "owner": "y"}]}, "unknown key 'owner'"),
        ("stripe", {"secrets": [{"account": "y"}]}, "'value'"),
        ("stripe", {"secrets": [5]}, "must be a string or a table"),
        ("stripe", {"secrets": ["whsec_x"], "tolerance": "soon"}, "tolerance"),
        ("stripe", {"secrets": ["whsec_x"], "tolerance": True}, "tolerance"),
        ("stripe", {"secrets": ["whsec_x"], "max_body": 0}, "max_body"),
        ("stripe", {"secrets": ["whsec_x"], "verify_timestamp": 1}, "verify_timestamp"),
        (5, {"secrets": ["whsec_x"]}, "unknown source provider"),
        ("stripe", {"secrets": ["whsec_x"], "tenants": {"a": 1}}, "tenants"),
        ("github", {"secrets": ["x"], "header": "X-Sig"}, "unknown option 'header'"),
        ("hmac", {"secrets": ["x"], "header": "X-Sig"}, "id_path"),
        ("hmac", {"secrets": ["x"], "header": 5, "id_path": "id"}, "header"),
    ],
)
def test_from_config_errors(provider: Any, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        sources.from_config(provider, options)
    assert "whsec_x" not in str(info.value)


def test_from_config_single_secret_string() -> None:
    source = sources.from_config("github", {"secrets": "only-one"})
    assert [s.value for s in source.secrets] == ["only-one"]
    source = sources.from_config("github", {"secret": {"value": "v", "tenant": "t"}})
    assert source.secrets == (Secret("v", tenant="t"),)


def test_from_config_table_naming_its_provider() -> None:
    # Relaybox passes each [sources.NAME] table as is.
    source = sources.from_config({"provider": "slack", "secrets": ["s"], "tolerance": 60})
    assert isinstance(source, sources.SlackSource)
    with pytest.raises(ConfigurationError, match="needs provider"):
        sources.from_config({"secrets": ["s"]})
    with pytest.raises(ConfigurationError, match="does not match"):
        sources.from_config("slack", {"provider": "github", "secrets": ["s"]})


def test_from_config_reads_environment_strings() -> None:
    # RELAYBOX_SOURCES__X__OPTION variables arrive as text.
    source = sources.from_config(
        "stripe",
        {
            "secrets": "whsec_env",
            "tolerance": "600",
            "max_body": "2048",
            "verify_timestamp": "false",
            "ignore_types": "customer.*, charge.refunded",
        },
    )
    assert (source.tolerance, source.max_body, source.verify_timestamp) == (600.0, 2048, False)
    assert source.ignore_types == ("customer.*", "charge.refunded")
    assert len(source.secrets) == 1


def test_from_config_knows_every_source_option() -> None:
    parameters = inspect.signature(Source.__init__).parameters
    expected = {name for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert set(registry.BASE_OPTIONS) == expected - {"secrets"}


def test_package_exports() -> None:
    assert sources.__all__ == sorted(sources.__all__)
    for name in sources.__all__:
        assert hasattr(sources, name)


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": 1}',
        b"[1, 2]",
        b'{"a": "\xc3\xa9"}',
        b'{"a": "\xed\xa0\x80"}',  # a lone surrogate, as json.loads(bytes) lets through
        '{"a": "é"}'.encode("utf-16-le"),
        '{"a": "é"}'.encode("utf-16"),
        '{"a": "é"}'.encode("utf-8-sig"),
        b'  {"a": 1}',
        b"{",
        b'{"a": "\xff"}',
        b"{}",
        b"[",
        b"",
    ],
)
def test_parse_reads_json_as_json_loads_does(body: bytes) -> None:
    """``Source.parse`` decodes plain UTF-8 objects itself (the receiver's hot path)
    and leaves everything else to ``json.loads``: same value, same refusals."""
    source = sources.standard(secrets=[Secret("whsec_" + base64.b64encode(b"k" * 24).decode())])
    try:
        expected: Any = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        with pytest.raises(MalformedPayload):
            source.parse(body)
        return
    assert source.parse(body) == expected
