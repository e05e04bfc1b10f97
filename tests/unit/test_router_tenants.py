"""Tenants at the router: keys, limits and their answers; pure, then through a real router on
loopback in front of an emulated engine."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferfleet.router.fairness import Priority
from inferfleet.router.tenants import (
    KeyRing,
    Refusal,
    TenantConfigError,
    Tenants,
    TenantSpec,
    TokenBucket,
    parse_tenant,
)
from inferfleet.sim.openai_api import SimServer
from inferfleet.sim.openai_api import create_app as create_engine
from tests.unit import test_router_proxy
from tests.unit.test_router_proxy import (
    CONFIG,
    MODEL,
    aggregated,
    config,
    metrics,
    series,
    start_engine,
    start_router,
)

servers = test_router_proxy.servers


def test_a_tenant_flag_parses() -> None:
    spec = parse_tenant("name=a,keys=/k/a,rps=2.5,tpm=6000,concurrency=4,models=m1;m2")
    assert spec == TenantSpec("a", "/k/a", 2.5, 6000.0, 4, ("m1", "m2"))
    assert parse_tenant("name=b,keys=/k/b") == TenantSpec("b", "/k/b")
    assert parse_tenant("name=c,keys=/k/c,priority=batch").priority is Priority.BATCH


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("name=a", "name= and keys= are required"),
        ("name=a,keys=/k,rps=fast", "are numbers"),
        ("name=a,keys=/k,rps=0", "positive"),
        ("name=a,keys=/k,tpm=nan", "positive"),
        ("name=a,keys=/k,colour=red", "'colour=red'"),
        ("name=a,name=b,keys=/k", "twice"),
        ("name=a,keys=/k,priority=urgent", "priority is interactive or batch"),
    ],
)
def test_bad_tenant_flags_say_what_is_wrong(flag: str, says: str) -> None:
    with pytest.raises(TenantConfigError) as caught:
        parse_tenant(flag)
    assert says in str(caught.value)


def test_keys_are_kept_as_digests_and_a_rotation_retires_the_old_one() -> None:
    ring = KeyRing()
    ring.replace("a", ["old-key", " ", "second-key\n"])
    ring.replace("b", ["b-key"])
    assert ring.tenant_of("old-key") == "a"
    assert ring.tenant_of("second-key") == "a"
    assert "old-key" not in repr(vars(ring))
    ring.replace("a", ["new-key"])
    assert ring.tenant_of("old-key") is None
    assert ring.tenant_of("new-key") == "a"
    assert ring.tenant_of("b-key") == "b"  # another tenant's rotation leaves it alone
    assert len(ring) == 2


def test_a_token_bucket_says_how_long_until_it_would_pass() -> None:
    bucket = TokenBucket(rate=2.0, capacity=2.0)
    assert bucket.take(1, now=0.0) == 0.0
    assert bucket.take(1, now=0.0) == 0.0
    assert bucket.take(1, now=0.0) == pytest.approx(0.5)  # nothing taken
    assert bucket.take(1, now=0.5) == 0.0
    # More than a full bucket holds passes from a full bucket, and leaves it in debt.
    big = TokenBucket(rate=10.0, capacity=100.0)
    assert big.take(250, now=0.0) == 0.0
    assert big.take(1, now=10.0) == pytest.approx(5.1)
    big.give_back(1000, now=10.0)
    assert big.level == 100.0


def tenants(*specs: TenantSpec) -> Tenants:
    built = Tenants(specs)
    for spec in specs:
        built.keys.replace(spec.name, [f"{spec.name}-key"])
    return built


def test_who_sends_a_request_is_its_bearer_key() -> None:
    known = tenants(TenantSpec("a", "/k"))
    missing = known.authenticate({})
    assert isinstance(missing, Refusal)
    assert missing.status == 401
    assert "Authorization: Bearer" in missing.message
    wrong = known.authenticate({"Authorization": "Bearer b-key"})
    assert isinstance(wrong, Refusal)
    assert wrong.status == 401
    assert "not valid" in wrong.message
    basic = known.authenticate({"Authorization": "Basic a-key"})
    assert isinstance(basic, Refusal)
    assert basic.status == 401
    assert known.authenticate({"Authorization": "Bearer a-key"}) == "a"


def test_limits_on_requests_a_second_and_at_once() -> None:
    limited = tenants(TenantSpec("a", "/k", requests_per_s=1.0, max_concurrent=2))
    assert limited.admit("a", now=0.0) is None
    over = limited.admit("a", now=0.1)
    assert over is not None
    assert over.status == 429
    assert over.retry_after_s == pytest.approx(0.9)
    assert limited.admit("a", now=1.0) is None
    busy = limited.admit("a", now=5.0)  # two running
    assert busy is not None
    assert "2 requests running" in busy.message
    limited.end("a")
    assert limited.admit("a", now=5.0) is None


def test_tokens_a_minute_are_charged_up_front_and_the_unused_given_back() -> None:
    limited = tenants(TenantSpec("a", "/k", tokens_per_minute=600.0, models=("m",)))
    assert limited.charge("a", 500, now=0.0) is None
    over = limited.charge("a", 200, now=0.0)
    assert over is not None
    assert over.retry_after_s == pytest.approx(10.0)
    limited.refund("a", 400, now=0.0)  # the first used only 100
    assert limited.charge("a", 200, now=0.0) is None
    assert limited.may_use("a", "m") is None
    assert limited.may_use("a", None) is None
    forbidden = limited.may_use("a", "other")
    assert forbidden is not None
    assert forbidden.status == 403


def key_dir(root: Path, tenant: str, *keys: str) -> str:
    directory = root / tenant
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.iterdir():
        if old.is_file():
            old.unlink()
    for i, key in enumerate(keys):
        (directory / f"key-{i}").write_text(key + "\n")
    (directory / "..data").mkdir(exist_ok=True)  # the kubelet's own entries are skipped
    return str(directory)


async def test_two_tenants_keys_limits_and_a_rotation_without_restart(
    servers: dict[str, Any], tmp_path: Path
) -> None:
    engine = await start_engine(servers)
    keys_a = key_dir(tmp_path, "a", "a-1")
    keys_b = key_dir(tmp_path, "b", "b-1")
    client = await start_router(
        servers,
        config(
            aggregated(engine),
            tenants=(
                # One request a second: the second, sent at once, waits a second however slow
                # the machine.
                parse_tenant(f"name=a,keys={keys_a},rps=1"),
                parse_tenant(f"name=b,keys={keys_b},models=other"),
            ),
            key_reload_s=0.05,
        ),
    )
    body = {"model": MODEL, "prompt": "w", "max_tokens": 1}

    async def post(key: str | None) -> httpx.Response:
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        return await client.post("/v1/completions", json=body, headers=headers)

    assert (await post(None)).status_code == 401
    assert (await post("nobody")).status_code == 401
    assert (await post("a-1")).status_code == 200
    limited = await post("a-1")
    assert limited.status_code == 429
    assert int(limited.headers["Retry-After"]) >= 1
    forbidden = await post("b-1")
    assert forbidden.status_code == 403
    assert "may not use" in forbidden.json()["error"]["message"]

    key_dir(tmp_path, "a", "a-2")  # rotated: the old key deleted, a new one added
    for _ in range(200):
        if (await post("a-1")).status_code == 401:
            break
        await asyncio.sleep(0.02)
    assert (await post("a-1")).status_code == 401
    await asyncio.sleep(1.1)  # the request bucket refills
    assert (await post("a-2")).status_code == 200
    text = await metrics(client)
    assert series(text, "inferfleet_router_rejected_requests_total", reason="unauthenticated") >= 3
    assert series(text, "inferfleet_router_rejected_requests_total", reason="rate_limited") >= 1
    assert series(text, "inferfleet_router_rejected_requests_total", reason="forbidden") == 1
    assert series(text, "inferfleet_router_requests_total") == 2  # refusals are not judged
    # Usage per tenant: what each was served, and what each was refused.
    assert series(text, "inferfleet_router_tenant_requests_total", tenant="a") == 2
    assert series(text, "inferfleet_router_tenant_requests_total", tenant="b") == 0
    assert series(text, "inferfleet_router_tenant_tokens_total", tenant="a", kind="output") == 2
    assert series(text, "inferfleet_router_tenant_tokens_total", tenant="a", kind="prompt") > 0
    assert series(text, "inferfleet_router_tenant_rejected_requests_total", tenant="a") == series(
        text, "inferfleet_router_rejected_requests_total", reason="rate_limited"
    )
    assert (
        series(
            text, "inferfleet_router_tenant_rejected_requests_total", tenant="b", reason="forbidden"
        )
        == 1
    )


async def _noisy_and_quiet(
    servers: dict[str, Any], tmp_path: Path, noisy_limits: str, quiet_requests: int
) -> tuple[list[float | None], list[int]]:
    """A noisy tenant keeps 16 requests going at an engine of four sequences while a quiet one
    sends a request every 0.2 s; the quiet tenant's TTFTs (None: failed or refused) and the
    noisy one's answer codes."""
    server = SimServer(
        create_engine(replace(CONFIG, max_sequences=4), MODEL), "127.0.0.1", 0, drain_timeout_s=1.0
    )
    servers["engines"].append(server)
    engine = f"http://127.0.0.1:{await server.start()}"
    noisy_keys = key_dir(tmp_path / "noisy", "noisy", "noisy-1")
    quiet_keys = key_dir(tmp_path / "quiet", "quiet", "quiet-1")
    client = await start_router(
        servers,
        config(
            aggregated(engine),
            tenants=(
                parse_tenant(f"name=noisy,keys={noisy_keys}{noisy_limits}"),
                parse_tenant(f"name=quiet,keys={quiet_keys}"),
            ),
        ),
    )

    done = asyncio.Event()

    async def noisy() -> list[int]:
        """Back to back until the quiet tenant is done: a refusal only slows it a little."""
        body = {"model": MODEL, "prompt": "w " * 200, "max_tokens": 100}
        codes = []
        while not done.is_set():
            answer = await client.post(
                "/v1/completions", json=body, headers={"Authorization": "Bearer noisy-1"},
                timeout=120,
            )  # fmt: skip
            codes.append(answer.status_code)
            if answer.status_code == 429:
                await asyncio.sleep(0.05)
        return codes

    async def quiet() -> float | None:
        body = {"model": MODEL, "prompt": "w " * 50, "max_tokens": 4, "stream": True}
        started = asyncio.get_running_loop().time()
        headers = {"Authorization": "Bearer quiet-1"}
        async with client.stream(
            "POST", "/v1/completions", json=body, headers=headers, timeout=60
        ) as answer:
            if answer.status_code != 200:
                return None
            async for line in answer.aiter_lines():
                if line.startswith("data: {"):
                    return asyncio.get_running_loop().time() - started
        return None

    flood = [asyncio.create_task(noisy()) for _ in range(16)]
    await asyncio.sleep(0.3)  # the flood is in
    ttfts = []
    for _ in range(quiet_requests):
        ttfts.append(await quiet())
        await asyncio.sleep(0.2)
    done.set()
    return ttfts, [code for codes in await asyncio.gather(*flood) for code in codes]


QUIET_TTFT_S = 0.5
"""The quiet tenant's TTFT target: a 50-token prompt takes a few tens of ms on this engine."""


async def test_a_noisy_tenant_over_its_limit_gets_429_and_the_quiet_one_keeps_its_slo(
    servers: dict[str, Any], tmp_path: Path
) -> None:
    ttfts, codes = await _noisy_and_quiet(servers, tmp_path, ",concurrency=2", 20)
    assert codes.count(429) > codes.count(200), codes  # two at a time: the rest refused
    assert set(codes) <= {200, 429}, codes
    met = [t for t in ttfts if t is not None and t <= QUIET_TTFT_S]
    assert len(met) >= 0.9 * len(ttfts), ttfts


async def test_without_a_limit_the_same_flood_takes_the_quiet_tenant_s_slo(
    servers: dict[str, Any], tmp_path: Path
) -> None:
    # The control: what the limit protects against. The flood holds the engine's four
    # sequences for seconds and queues behind them; so does the quiet tenant.
    ttfts, codes = await _noisy_and_quiet(servers, tmp_path, "", 5)
    assert set(codes) == {200}, codes
    met = [t for t in ttfts if t is not None and t <= QUIET_TTFT_S]
    assert len(met) < 0.9 * len(ttfts), ttfts


async def test_when_the_engine_is_full_interactive_goes_first_and_tenants_share_fairly(
    servers: dict[str, Any], tmp_path: Path
) -> None:
    # One sequence at a time: every other request waits at the router, where the order is
    # decided (the engine itself would serve first come, first served).
    server = SimServer(
        create_engine(replace(CONFIG, max_sequences=1), MODEL), "127.0.0.1", 0, drain_timeout_s=1.0
    )
    servers["engines"].append(server)
    engine = f"http://127.0.0.1:{await server.start()}"
    names = ("etl", "chat", "search")
    flags = {name: f"name={name},keys={key_dir(tmp_path, name, name + '-key')}" for name in names}
    client = await start_router(
        servers,
        config(
            aggregated(engine) + ",seqs=1",
            tenants=(
                parse_tenant(flags["etl"] + ",priority=batch"),
                parse_tenant(flags["chat"]),
                parse_tenant(flags["search"]),
            ),
        ),
    )
    finished: list[str] = []

    async def call(tenant: str, tokens: int) -> None:
        body = {"model": MODEL, "prompt": "w " * 20, "max_tokens": tokens}
        headers = {"Authorization": f"Bearer {tenant}-key"}
        answer = await client.post("/v1/completions", json=body, headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text
        finished.append(tenant)

    calls = [asyncio.create_task(call("etl", 200)) for _ in range(3)]
    await asyncio.sleep(0.2)  # the first batch request holds the engine, two wait
    calls += [asyncio.create_task(call("chat", 40)) for _ in range(4)]
    await asyncio.sleep(0.05)
    calls.append(asyncio.create_task(call("search", 40)))
    await asyncio.gather(*calls)
    # The batch request already running ends first; then interactive before batch, and among
    # the interactive, search (served nothing yet) before chat's second request.
    assert finished[0] == "etl"
    assert finished[1:3] == ["chat", "search"], finished
    assert finished[-2:] == ["etl", "etl"], finished
