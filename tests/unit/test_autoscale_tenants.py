"""Usage and cost per tenant from the router's per-tenant token rates (pure)."""

from __future__ import annotations

import pytest

from inferfleet.autoscale.queries import MalformedAnswerError, labelled_values
from inferfleet.autoscale.tenants import TenantTokens, tenant_tokens, tenant_usage


def test_the_answer_is_read_per_tenant_and_kind() -> None:
    result = [
        {"metric": {"tenant": "a", "kind": "prompt"}, "value": [1.0, "100"]},
        {"metric": {"tenant": "a", "kind": "output"}, "value": [1.0, "10"]},
        {"metric": {"tenant": "b", "kind": "output"}, "value": [1.0, "NaN"]},  # no rate yet
        {"metric": {"kind": "output"}, "value": [1.0, "5"]},  # not a tenant's
    ]
    tokens = tenant_tokens(labelled_values("tenant_tokens", result))
    assert tokens == {"a": TenantTokens(100.0, 10.0)}


def test_an_answer_that_is_not_a_vector_of_numbers_is_refused() -> None:
    with pytest.raises(MalformedAnswerError, match="not an instant vector"):
        labelled_values("tenant_tokens", {"resultType": "matrix"})
    with pytest.raises(MalformedAnswerError, match="not a number"):
        labelled_values("tenant_tokens", [{"metric": {}, "value": [1.0, "many"]}])


def test_shares_add_up_to_the_whole_cost_and_weigh_output_twice() -> None:
    usage = tenant_usage({"a": TenantTokens(100.0, 0.0), "b": TenantTokens(0.0, 50.0)}, 8.0)
    assert [(u.tenant, u.share, u.cost_per_hour_usd) for u in usage] == [
        ("a", 0.5, 4.0),
        ("b", 0.5, 4.0),
    ]
    assert sum(u.cost_per_hour_usd for u in usage) == pytest.approx(8.0)


def test_nothing_served_charges_no_one() -> None:
    assert tenant_usage({"a": TenantTokens()}, 8.0) == ()
    assert tenant_usage({}, 8.0) == ()
