"""Pins: parsing, refusal of malformed ones, expiry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from inferfleet.api.model_deployment import Role
from inferfleet.reconcile.pins import PIN_ANNOTATION, read_pin

NOW = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)


def test_a_valid_pin_is_read_and_expires() -> None:
    pin, problem = read_pin(
        {
            PIN_ANNOTATION: '{"replicas": {"decode": 6, "prefill": 2}, "reason": "INC-1", '
            '"until": "2026-11-22T06:00:00Z"}'
        }
    )
    assert problem is None
    assert pin is not None
    assert pin.replicas == {Role.DECODE: 6, Role.PREFILL: 2}
    assert pin.active(NOW)
    assert not pin.active(NOW + timedelta(hours=3))
    assert pin.describe() == "pinned decode=6, prefill=2 until 2026-11-22T06:00:00+00:00: INC-1"


def test_no_annotation_no_pin() -> None:
    assert read_pin({}) == (None, None)


UNTIL = '"until": "2026-11-22T06:00:00Z"'


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not json", "pin: Invalid JSON"),
        ('{"replicas": {"decode": 2}, "reason": "x"}', "until: Field required"),
        ('{"replicas": {"gpu": 2}, "reason": "x", ' + UNTIL + "}", "replicas.gpu"),
        ('{"replicas": {}, "reason": "x", ' + UNTIL + "}", "replicas"),
        ('{"replicas": {"decode": 2}, "reason": "x", "until": "2026-11-22T06:00:00"}', "until"),
        ('{"replicas": {"decode": -1}, "reason": "x", ' + UNTIL + "}", "negative"),
    ],
)  # fmt: skip
def test_a_malformed_pin_is_ignored_with_the_reason(text: str, problem: str) -> None:
    pin, why = read_pin({PIN_ANNOTATION: text})
    assert pin is None
    assert why is not None
    assert problem in why
