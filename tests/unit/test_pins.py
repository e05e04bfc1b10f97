"""Pins: parsing, refusal of malformed ones (as a whole, with the field, value and rule), expiry."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from inferfleet.api.common import MAX_REPLICAS
from inferfleet.api.model_deployment import Role
from inferfleet.api.pins import MAX_PIN_DURATION, PIN_ANNOTATION, Pin, read_pin

NOW = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
AGGREGATED = {Role.AGGREGATED}
DISAGGREGATED = {Role.PREFILL, Role.DECODE}
UNTIL = '"until": "2026-11-22T06:00:00Z"'


def _read(text: str, roles: set[Role] = AGGREGATED) -> tuple[Pin | None, str | None]:
    return read_pin({PIN_ANNOTATION: text}, roles=roles, now=NOW)


def test_a_valid_pin_is_read_and_expires() -> None:
    pin, problem = _read(
        '{"replicas": {"decode": 6, "prefill": 2}, "reason": "INC-1", ' + UNTIL + "}",
        DISAGGREGATED,
    )
    assert problem is None
    assert pin is not None
    assert pin.replicas == {Role.DECODE: 6, Role.PREFILL: 2}
    assert pin.active(NOW)
    assert not pin.active(NOW + timedelta(hours=3))
    assert pin.describe() == "pinned decode=6, prefill=2 until 2026-11-22T06:00:00+00:00: INC-1"


def test_no_annotation_no_pin() -> None:
    assert read_pin({}, roles=AGGREGATED, now=NOW) == (None, None)


def _pin(replicas: object, until: datetime = NOW + timedelta(hours=3)) -> str:
    return json.dumps({"replicas": replicas, "reason": "INC-1", "until": until.isoformat()})


@pytest.mark.parametrize(
    ("text", "roles", "replicas"),
    [
        (_pin({"aggregated": 0}), AGGREGATED, {Role.AGGREGATED: 0}),
        (_pin({"aggregated": MAX_REPLICAS}), AGGREGATED, {Role.AGGREGATED: MAX_REPLICAS}),
        (_pin({"decode": 3}), DISAGGREGATED, {Role.DECODE: 3}),
        (_pin({"prefill": 1, "decode": 4}), DISAGGREGATED, {Role.PREFILL: 1, Role.DECODE: 4}),
        (_pin({"aggregated": 2}, NOW + MAX_PIN_DURATION), AGGREGATED, {Role.AGGREGATED: 2}),
        # Expired: read (the caller finds it inactive), not refused.
        (_pin({"aggregated": 2}, NOW - timedelta(days=30)), AGGREGATED, {Role.AGGREGATED: 2}),
        # Any offset is fine as long as it is explicit.
        (_pin({"aggregated": 2}, datetime(2026, 11, 22, 9, tzinfo=UTC).astimezone(
            datetime.now(UTC).astimezone().tzinfo)), AGGREGATED, {Role.AGGREGATED: 2}),
    ],
)  # fmt: skip
def test_a_valid_pin_is_taken_whole(text: str, roles: set[Role], replicas: dict[Role, int]) -> None:
    pin, problem = _read(text, roles)
    assert problem is None
    assert pin is not None
    assert pin.replicas == replicas


TOO_LATE = NOW + MAX_PIN_DURATION + timedelta(seconds=1)


@pytest.mark.parametrize(
    ("text", "roles", "problem"),
    [
        ("not json", AGGREGATED, "pin: Invalid JSON"),
        ("[1]", AGGREGATED, "pin: Input should be an object"),
        ('{"replicas": {"aggregated": 2}, "reason": "x"}', AGGREGATED, "until: Field required"),
        ('{"replicas": {"aggregated": 2}, ' + UNTIL + "}", AGGREGATED, "reason: Field required"),
        ('{"reason": "x", ' + UNTIL + "}", AGGREGATED, "replicas: Field required"),
        ('{"replicas": {"aggregated": 2}, "reason": "", ' + UNTIL + "}", AGGREGATED,
         'reason: String should have at least 1 character (got "")'),
        ('{"replicas": {"aggregated": 2}, "reason": "  ", ' + UNTIL + "}", AGGREGATED,
         'reason: String should match pattern'),
        ('{"replicas": {"aggregated": 2}, "reason": 7, ' + UNTIL + "}", AGGREGATED,
         "reason: Input should be a valid string (got 7)"),
        ('{"replicas": {"aggregated": 2}, "reason": "x", "owner": "me", ' + UNTIL + "}",
         AGGREGATED, 'owner: Extra inputs are not permitted (got "me")'),
        # Replica counts: JSON integers from 0 to MAX_REPLICAS, nothing else.
        (_pin({"aggregated": 2147483648}), AGGREGATED,
         f"replicas.aggregated: Input should be less than or equal to {MAX_REPLICAS} "
         "(got 2147483648)"),
        (_pin({"aggregated": MAX_REPLICAS + 1}), AGGREGATED,
         f"replicas.aggregated: Input should be less than or equal to {MAX_REPLICAS}"),
        (_pin({"aggregated": -1}), AGGREGATED,
         "replicas.aggregated: Input should be greater than or equal to 0 (got -1)"),
        (_pin({"aggregated": True}), AGGREGATED,
         "replicas.aggregated: Input should be a valid integer (got true)"),
        (_pin({"aggregated": "4"}), AGGREGATED,
         'replicas.aggregated: Input should be a valid integer (got "4")'),
        (_pin({"aggregated": 4.0}), AGGREGATED,
         "replicas.aggregated: Input should be a valid integer (got 4.0)"),
        (_pin({"aggregated": 2.5}), AGGREGATED, "replicas.aggregated: Input should be a valid"),
        (_pin({"aggregated": None}), AGGREGATED,
         "replicas.aggregated: Input should be a valid integer (got null)"),
        (_pin({"aggregated": [4]}), AGGREGATED, "replicas.aggregated: Input should be a valid"),
        (_pin({}), AGGREGATED, "replicas: Dictionary should have at least 1 item"),
        (_pin([["aggregated", 2]]), AGGREGATED, "replicas: Input should be an object"),
        # Roles: known ones, and only the deployment's own.
        (_pin({"gpu": 2}), AGGREGATED,
         "replicas.gpu: Input should be 'aggregated', 'prefill' or 'decode' (got \"gpu\")"),
        (_pin({"Aggregated": 2}), AGGREGATED, 'replicas.Aggregated: Input should be'),
        (_pin({"decode": 2}), AGGREGATED,
         "replicas: a pin may only name the deployment's roles (aggregated) (got decode)"),
        (_pin({"aggregated": 2}), DISAGGREGATED,
         "replicas: a pin may only name the deployment's roles (decode, prefill) "
         "(got aggregated)"),
        # The valid role is not applied alone: the whole pin is refused.
        (_pin({"decode": 2, "aggregated": 3}), DISAGGREGATED, "(got aggregated)"),
        (_pin({"decode": 2, "prefill": "3"}), DISAGGREGATED, 'replicas.prefill: Input should '
         'be a valid integer (got "3")'),
        # Expiry: explicit offset, a real time, within MAX_PIN_DURATION.
        ('{"replicas": {"aggregated": 2}, "reason": "x", "until": "2026-11-22T06:00:00"}',
         AGGREGATED, "until: Input should have timezone info"),
        ('{"replicas": {"aggregated": 2}, "reason": "x", "until": "tomorrow"}', AGGREGATED,
         'until: Input should be a valid datetime'),
        ('{"replicas": {"aggregated": 2}, "reason": "x", "until": 1795000000}', AGGREGATED,
         "until: Input should be a valid datetime"),
        (_pin({"aggregated": 2}, TOO_LATE), AGGREGATED,
         "until: a pin may last at most 7 days, to 2026-11-29T03:00:00+00:00 at the latest "
         "(got 2026-11-29T03:00:01+00:00)"),
        (_pin({"aggregated": 2}, NOW + timedelta(days=3650)), AGGREGATED,
         "until: a pin may last at most 7 days"),
    ],
)  # fmt: skip
def test_a_bad_pin_is_ignored_whole_with_the_field_value_and_rule(
    text: str, roles: set[Role], problem: str
) -> None:
    pin, why = _read(text, roles)
    assert pin is None
    assert why is not None
    assert why.startswith(f"{PIN_ANNOTATION} ignored: ")
    assert problem in why


def test_a_long_value_is_quoted_short() -> None:
    pin, why = _read(_pin({"aggregated": "x" * 5000}))
    assert pin is None
    assert why is not None
    assert len(why) < 300
    assert why.endswith("...)")


def test_max_replicas_fits_a_deployment() -> None:
    assert 0 < MAX_REPLICAS < 2**31
