"""The router's pure parts: flags, choice of replica, request rewriting, SLO outcomes, and the
stream reader it shares with the load generator."""

from __future__ import annotations

from array import array
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferfleet.api.model_deployment import EngineName, Role
from inferfleet.router.balancer import Balancer, PrefixIndex, Replica
from inferfleet.router.config import Backend, RouterConfig, RouterConfigError, parse_backend
from inferfleet.router.discovery import ready_urls
from inferfleet.router.requests import (
    BadRequestError,
    CharsPerToken,
    HandoffError,
    decode_body,
    prefill_body,
    read_request,
    upstream_body,
)
from inferfleet.slo import Outcome, Slo
from inferfleet.streaming import TokenStream

# Flags.

RENDERED = (
    "deployment=chat,role=decode,engine=vllm,weight=100,model=llama,context=8192,seqs=256,"
    "service=chat-decode,port=8000"
)


def test_a_rendered_backend_flag_parses() -> None:
    backend = parse_backend(RENDERED)
    assert backend == Backend(
        "chat", Role.DECODE, EngineName.VLLM, "llama", 100, "chat-decode",
        context=8192, sequences=256,
    )  # fmt: skip


def test_the_engines_sequences_bound_the_router_only_where_every_serving_pool_says() -> None:
    prefill = parse_backend("deployment=pd,role=prefill,engine=sim,model=m,service=p,seqs=8")
    decode = parse_backend("deployment=pd,role=decode,engine=sim,model=m,service=d,seqs=64")
    other = parse_backend("deployment=b,role=aggregated,engine=sim,model=m,service=b")
    assert RouterConfig("s", (prefill, decode)).engine_sequences() == {("pd", Role.DECODE): 64}
    assert RouterConfig("s", (prefill, decode, other)).engine_sequences() is None


def test_fixed_urls_parse() -> None:
    backend = parse_backend(
        "deployment=a,role=aggregated,engine=sim,model=m,urls=http://127.0.0.1:1;http://[::1]:2/"
    )
    assert backend.urls == ("http://127.0.0.1:1", "http://[::1]:2")


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("deployment=a,role=aggregated,engine=sim", "missing model"),
        ("deployment=a,role=middle,engine=sim,model=m,service=s", "middle"),
        ("deployment=a,role=aggregated,engine=ollama,model=m,service=s", "ollama"),
        ("deployment=a,role=aggregated,engine=sim,model=m", "service= (Kubernetes) or urls="),
        ("deployment=a,role=aggregated,engine=sim,model=m,colour=red", "'colour=red'"),
        ("deployment=a,role=aggregated,engine=sim,model=m,urls=127.0.0.1:80", "http(s)://"),
        ("deployment=a,role=aggregated,engine=sim,model=m,service=s,port=x", "integers"),
        ("deployment=a,role=aggregated,engine=sim,model=m,service=s,context=0", "a context in"),
        ("deployment=a,role=aggregated,engine=sim,model=m,service=s,seqs=0", "seqs is at least"),
        ("deployment=a,role=aggregated,engine=sim,model=m,service=s,seqs=x", "integers"),
        ("deployment=a,deployment=b,role=aggregated,engine=sim,model=m,service=s", "twice"),
    ],
)
def test_bad_backend_flags_say_what_is_wrong(flag: str, says: str) -> None:
    with pytest.raises(RouterConfigError, match=None) as caught:
        parse_backend(flag)
    assert says in str(caught.value)


@pytest.mark.parametrize("asked", [10**300, 10**400, 2**63])
def test_a_huge_max_tokens_is_charged_as_the_longest_context_in_whole_tokens(asked: int) -> None:
    """No replica works for more tokens than its context holds: the load a request adds is an
    integer within it, so it is given back exactly (a float of 1e300 never comes back down)."""
    request = read_request(
        {"prompt": "w " * 10, "max_tokens": asked}, chat=False, longest_context=8192
    )
    assert request.max_tokens_estimate == 8192
    assert isinstance(request.max_tokens_estimate, int)
    replica = Replica("http://a:1", "d", Role.AGGREGATED)
    replica.outstanding_tokens += request.max_tokens_estimate
    replica.outstanding_tokens -= request.max_tokens_estimate
    assert replica.outstanding_tokens == 0


@pytest.mark.parametrize(
    ("context", "given", "limit"),
    [
        (131_072, None, 4 * 1024**2),  # 32 bytes a token of context
        (8192, None, 1024**2),  # at least 1 MiB
        (None, None, 16 * 1024**2),  # no context given: at most 16 MiB
        (131_072, 1000, 1000),  # the flag wins
    ],
)
def test_the_body_limit_follows_the_models_context(
    context: int | None, given: int | None, limit: int
) -> None:
    flag = "deployment=a,role=aggregated,engine=sim,model=m,service=s"
    if context is not None:
        flag += f",context={context}"
    config = RouterConfig("svc", (parse_backend(flag),), max_request_bytes=given)
    assert config.request_bytes_limit == limit


def test_the_model_asked_for_is_read_and_must_be_a_name() -> None:
    assert read_request({"model": "m", "prompt": "w"}, chat=False).model == "m"
    assert read_request({"prompt": "w"}, chat=False).model is None
    with pytest.raises(BadRequestError, match="model must be a string"):
        read_request({"model": ["m"], "prompt": "w"}, chat=False)


def test_a_deployment_needs_aggregated_or_both_disaggregated_roles() -> None:
    prefill = parse_backend("deployment=a,role=prefill,engine=sim,model=m,service=p")
    with pytest.raises(RouterConfigError, match="prefill and decode"):
        RouterConfig("svc", (prefill,))
    with pytest.raises(RouterConfigError, match="at least one"):
        RouterConfig("svc", ())


# Choice of replica.


def balancer(loads: dict[str, int], slack: int = 100) -> Balancer:
    chooser = Balancer({"d": 1}, slack_tokens=slack)
    chooser.set_replicas("d", Role.AGGREGATED, loads)
    for replica in chooser.all_replicas():
        replica.healthy = True
        replica.outstanding_tokens = loads[replica.url]
    return chooser


def test_the_least_outstanding_tokens_win() -> None:
    chooser = balancer({"a": 500, "b": 20, "c": 300})
    assert chooser.choose("d", Role.AGGREGATED).url == "b"  # type: ignore[union-attr]


def test_prefix_affinity_holds_within_the_slack_and_yields_past_it() -> None:
    chooser = balancer({"a": 0, "b": 0}, slack=100)
    [a, b] = sorted(chooser.all_replicas(), key=lambda r: r.url)
    chooser.record_prefix(a, (1, 2, 3))
    a.outstanding_tokens = 80  # within 100 of b's 0
    assert chooser.choose("d", Role.AGGREGATED, (1, 2, 3, 4)) is a
    a.outstanding_tokens = 150  # past the slack: the least loaded
    assert chooser.choose("d", Role.AGGREGATED, (1, 2, 3, 4)) is b
    # The longest shared prefix wins among holders.
    a.outstanding_tokens = 0
    chooser.record_prefix(b, (1, 2))
    assert chooser.choose("d", Role.AGGREGATED, (1, 2, 3)) is a
    assert chooser.choose("d", Role.AGGREGATED, (9,)) in (a, b)


def test_unhealthy_and_excluded_replicas_are_never_chosen() -> None:
    chooser = balancer({"a": 0, "b": 10})
    replicas = {r.url: r for r in chooser.all_replicas()}
    replicas["a"].healthy = False
    assert chooser.choose("d", Role.AGGREGATED) is replicas["b"]
    assert chooser.choose("d", Role.AGGREGATED, exclude=["b"]) is None


def test_ties_go_round_robin() -> None:
    chooser = balancer({"a": 0, "b": 0, "c": 0})
    picks = {chooser.choose("d", Role.AGGREGATED).url for _ in range(3)}  # type: ignore[union-attr]
    assert picks == {"a", "b", "c"}


def test_deployments_share_traffic_by_weight() -> None:
    chooser = Balancer({"stable": 90, "canary": 10, "off": 0})
    for name in ("stable", "canary", "off"):
        chooser.set_replicas(name, Role.AGGREGATED, [f"http://{name}:1"])
    for replica in chooser.all_replicas():
        replica.healthy = True
    picks = [chooser.choose_deployment() for _ in range(1000)]
    assert picks.count("stable") == 900
    assert picks.count("canary") == 100
    # A deployment with no healthy replica gets nothing; none at all: None.
    for replica in chooser.all_replicas():
        replica.healthy = replica.deployment == "canary"
    assert {chooser.choose_deployment() for _ in range(10)} == {"canary"}
    for replica in chooser.all_replicas():
        replica.healthy = False
    assert chooser.choose_deployment() is None


def test_a_disaggregated_deployment_needs_both_roles_healthy() -> None:
    chooser = Balancer({"d": 1})
    chooser.set_replicas("d", Role.PREFILL, ["p"])
    chooser.set_replicas("d", Role.DECODE, ["q"])
    assert chooser.roles_of("d") == [Role.PREFILL, Role.DECODE]
    [p] = chooser.replicas[("d", Role.PREFILL)].values()
    p.healthy = True
    assert not chooser.routable("d")
    [q] = chooser.replicas[("d", Role.DECODE)].values()
    q.healthy = True
    assert chooser.routable("d")


def test_replicas_that_go_away_are_dropped_with_their_prefixes() -> None:
    chooser = balancer({"a": 0, "b": 0})
    [a, _] = sorted(chooser.all_replicas(), key=lambda r: r.url)
    chooser.record_prefix(a, (7, 8))
    added = chooser.set_replicas("d", Role.AGGREGATED, ["b", "c"])
    assert [r.url for r in added] == ["c"]
    assert not added[0].healthy
    assert sorted(r.url for r in chooser.all_replicas()) == ["b", "c"]
    assert len(chooser.prefixes[("d", Role.AGGREGATED)]) == 0


def test_the_prefix_index_is_bounded() -> None:
    index = PrefixIndex(capacity=10)
    for block in range(100):
        index.record((block,), "a")
    assert len(index) == 10
    assert index.matches((99,), ["a"]) == {"a": 1}
    assert index.matches((0,), ["a"]) == {"a": 0}


def test_the_index_says_how_many_leading_blocks_a_recent_prompt_began_with() -> None:
    index = PrefixIndex(max_blocks=4)
    assert index.record((1, 2, 3), "a") == 0
    # A shared system prompt (1, 2) then a new question: two blocks seen, whoever held them.
    assert index.record((1, 2, 9), "b") == 2
    # Only the leading run counts: a block seen again after one that was not is no prefix.
    assert index.record((7, 2, 3), "a") == 0
    # Only the first max_blocks are looked at.
    assert index.record((1, 2, 3, 4, 5, 6), "a") == 3
    chooser = balancer({"a": 0})
    [a] = chooser.all_replicas()
    assert chooser.record_prefix(a, ()) == (0, 0)
    assert chooser.record_prefix(a, (5, 6)) == (2, 0)
    assert chooser.record_prefix(a, (5, 6, 8)) == (3, 2)


# Requests.


def test_a_prompt_is_estimated_and_its_prefix_hashed() -> None:
    text = "x" * 2000
    request = read_request({"prompt": text, "max_tokens": 7}, chat=False)
    assert request.prompt_tokens_estimate == 501
    assert request.max_tokens_estimate == 7
    assert len(request.prefix_blocks) == 3  # whole 512-character blocks
    again = read_request({"prompt": text + "y" * 100, "max_tokens": 7}, chat=False)
    assert again.prefix_blocks[:3] == request.prefix_blocks
    other = read_request({"prompt": "z" + text, "max_tokens": 7}, chat=False)
    assert set(other.prefix_blocks).isdisjoint(request.prefix_blocks)
    ids = read_request({"prompt": [1, 2, 3]}, chat=False)
    assert (ids.prompt_tokens_estimate, ids.max_tokens_estimate) == (3, 16)
    given_hashes = {"prompt": "a", "inferfleet": {"prefix_hashes": [5, 6]}}
    assert read_request(given_hashes, chat=False).prefix_blocks == (5, 6)


def test_characters_per_token_are_learned_from_the_engines_counts() -> None:
    """A prompt of single-token words runs about 5.5 characters a token: at a fixed 4 every
    arriving prompt would read 1.4x long, and the autoscaler would size for it."""
    learned = CharsPerToken(memory=4)
    assert learned.value == 4.0
    text = "people " * 1000
    first = read_request({"prompt": text}, chat=False, chars_per_token=learned.value)
    assert first.prompt_chars == len(text)
    assert first.prompt_tokens_estimate == 7000 // 4 + 1
    for _ in range(10):
        learned.observe(len(text), 1000)
    assert learned.value == pytest.approx(len(text) / 1000)
    again = read_request({"prompt": text}, chat=False, chars_per_token=learned.value)
    assert again.prompt_tokens_estimate == pytest.approx(1000, abs=1)
    # The ratio follows a change of traffic, a few `memory` reports on.
    for _ in range(40):
        learned.observe(3000, 1000)
    assert learned.value == pytest.approx(3.0, rel=0.01)
    learned.observe(1, 10_000)  # a pathological report is bounded
    assert learned.value >= 1.0
    assert read_request({"prompt": [1, 2]}, chat=False).prompt_chars is None


@pytest.mark.parametrize(
    ("body", "chat", "says"),
    [
        ([], False, "JSON object"),
        ({"prompt": 3}, False, "prompt"),
        ({"messages": []}, True, "messages"),
        ({"prompt": "a", "stream": "yes"}, False, "stream"),
        ({"prompt": "a", "max_tokens": "many"}, False, "max_tokens"),
    ],
)
def test_unroutable_bodies_are_refused(body: Any, chat: bool, says: str) -> None:
    with pytest.raises(BadRequestError, match=says):
        read_request(body, chat=chat)


def test_a_stream_always_asks_for_usage_upstream() -> None:
    quiet = read_request({"prompt": "a", "stream": True}, chat=False)
    assert upstream_body(quiet)["stream_options"] == {"include_usage": True}
    assert not quiet.client_wants_usage
    asked = read_request(
        {"prompt": "a", "stream": True, "stream_options": {"include_usage": True}}, chat=False
    )
    assert asked.client_wants_usage
    assert upstream_body(asked) is asked.body
    plain = read_request({"prompt": "a"}, chat=False)
    assert "stream_options" not in upstream_body(plain)


def test_the_vllm_hand_off_follows_the_nixl_proxy_protocol() -> None:
    body = {"model": "m", "prompt": "a", "max_tokens": 50, "stream": True, "stream_options": {}}
    prefill = prefill_body(EngineName.VLLM, body)
    assert prefill["stream"] is False
    assert prefill["max_tokens"] == 1
    assert "stream_options" not in prefill
    assert prefill["kv_transfer_params"]["do_remote_decode"] is True
    assert prefill["kv_transfer_params"]["do_remote_prefill"] is False
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [1]}
    decode = decode_body(EngineName.VLLM, body, {"kv_transfer_params": params})
    assert decode["kv_transfer_params"] == params
    assert decode["max_tokens"] == 50
    assert decode["stream"] is True
    assert "kv_transfer_params" not in body  # the client's body is left alone
    with pytest.raises(HandoffError, match="kv_transfer_params"):
        decode_body(EngineName.SIM, body, {"choices": []})


def test_the_tensorrt_llm_hand_off_uses_disaggregated_params() -> None:
    body = {"model": "m", "prompt": "a", "max_tokens": 50, "stream": True}
    context = prefill_body(EngineName.TENSORRT_LLM, body)
    assert context["disaggregated_params"] == {"request_type": "context_only"}
    assert context["stream"] is False
    handed = {"request_type": "context_only", "ctx_request_id": 7, "opaque_state": "x"}
    generation = decode_body(
        EngineName.TENSORRT_LLM, body, {"choices": [{"disaggregated_params": handed}]}
    )
    assert generation["disaggregated_params"] == {**handed, "request_type": "generation_only"}
    with pytest.raises(HandoffError, match="disaggregated_params"):
        decode_body(EngineName.TENSORRT_LLM, body, {"choices": [{}]})


# EndpointSlices.


def test_only_ready_endpoints_are_routed_to_on_the_named_port() -> None:
    slices: list[dict[str, Any]] = [
        {
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": False}},
                {"addresses": ["10.0.0.3"]},
            ],
        },
        {"addressType": "IPv6", "ports": None, "endpoints": [{"addresses": ["fd00::1"]}]},
        {"addressType": "FQDN", "endpoints": [{"addresses": ["example.com"]}]},
    ]
    assert ready_urls(slices, 9000) == [
        "http://10.0.0.1:8000",
        "http://10.0.0.3:8000",
        "http://[fd00::1]:9000",
    ]


# SLO outcomes.


@pytest.mark.parametrize(
    ("ok", "ttft", "tpot", "outcome"),
    [
        (True, 0.4, 0.04, Outcome.MET),
        (True, 0.6, 0.04, Outcome.MISSED_TTFT),
        (True, 0.4, 0.06, Outcome.MISSED_TPOT),
        (True, 0.6, 0.06, Outcome.MISSED_BOTH),
        (True, 0.5, 0.05, Outcome.MET),  # at the target is met
        (True, 0.4, None, Outcome.MET),  # one token: no TPOT to judge
        (True, None, None, Outcome.MISSED_TTFT),  # succeeded with no token
        (False, 0.1, 0.01, Outcome.FAILED),
    ],
)
def test_each_request_gets_one_outcome(
    ok: bool, ttft: float | None, tpot: float | None, outcome: Outcome
) -> None:
    slo = Slo(ttft_p95_ms=500.0, tpot_p95_ms=50.0)
    assert slo.outcome(ok=ok, ttft_s=ttft, tpot_s=tpot) is outcome


def test_targets_left_unset_are_not_judged() -> None:
    assert Slo().outcome(ok=True, ttft_s=99.0, tpot_s=9.0) is Outcome.MET


# The stream reader.


def token_event(index: int, chat: bool = False) -> bytes:
    if chat:
        return b'data: {"choices":[{"index":0,"delta":{"content":" t%d"}}]}\n\n' % index
    return b'data: {"choices":[{"index":0,"text":" t%d"}]}\n\n' % index


USAGE = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}}\n\n'
DONE = b"data: [DONE]\n\n"


@given(
    cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=12),
    chat=st.booleans(),
    drop_usage=st.booleans(),
)
def test_any_split_of_a_stream_reads_the_same(
    cuts: list[int], chat: bool, drop_usage: bool
) -> None:
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    whole = (role if chat else b"") + b"".join(token_event(i, chat) for i in range(1, 5))
    whole += USAGE + DONE
    positions = sorted({min(cut, len(whole)) for cut in cuts})
    pieces = [whole[a:b] for a, b in zip([0, *positions], [*positions, len(whole)], strict=True)]
    stream = TokenStream(drop_usage=drop_usage, gaps=array("d"))
    passed = b"".join(stream.feed(piece, float(n)) for n, piece in enumerate(pieces))
    assert stream.done
    assert stream.error is None
    assert stream.chunks == 4
    assert stream.tokens == 4
    assert stream.usage_prompt_tokens == 9
    assert len(stream.gaps or ()) == 3
    assert passed == (whole.replace(USAGE, b"") if drop_usage else whole)


def test_usage_wins_over_counted_chunks_and_errors_end_the_stream() -> None:
    stream = TokenStream()
    stream.feed(token_event(1) + USAGE, 1.0)
    assert (stream.chunks, stream.tokens) == (1, 4)  # several tokens in one event
    failing = TokenStream()
    failing.feed(token_event(1) + b'data: {"error":{"message":"engine died"}}\n\n', 2.0)
    assert failing.error == "engine died"
    assert failing.first_token_at == 2.0
    assert not failing.done
