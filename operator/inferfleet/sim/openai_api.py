"""The emulator's HTTP face: the subset of vLLM's OpenAI-compatible server a fleet relies on.

Served on aiohttp (already in the dependency tree through kopf; a mature asyncio server with
streaming responses and handler cancellation on disconnect, which is how an abandoned stream
aborts its request, as vLLM does).

Endpoints:
* `POST /v1/completions`, `POST /v1/chat/completions`: JSON bodies, or with `stream: true`
  server-sent events (`data: {...}` chunks, then `data: [DONE]`); `stream_options:
  {include_usage: true}` adds a final usage chunk. Every request runs to exactly `max_tokens`
  tokens and finishes with `finish_reason: "length"` (the emulator never samples an end of
  sequence: `ignore_eos` is implied). `max_tokens` defaults to 16 for completions and to the
  rest of the context for chat, as in vLLM; chat also takes `max_completion_tokens`.
  Sampling parameters, `stop` and `logprobs` are accepted and ignored; `n` must be 1.
* `GET /v1/models`, `GET /health` (200 while the engine loop runs and takes requests, 503
  while draining), `GET /metrics` (see `sim.metrics`).

Prompt length, which drives the timing:
* completions: `prompt` as a string counts its whitespace-separated words; as a list of token
  ids (or a one-element batch of either) its length;
* chat: the words of every text content part, plus `CHAT_TOKENS_PER_MESSAGE` per message for
  the chat template's role markers.
The output text is " tok1 tok2 ...", so it counts back to `completion_tokens` words.

Vendor extension (ignored by a real vLLM, which tolerates unknown fields): a request may carry
`"inferfleet": {"prefix_hashes": [int, ...], "hash_block_tokens": 512}`: ids of the prompt's
consecutive blocks of `hash_block_tokens` tokens, chained as in the Mooncake traces, which
drive the emulated prefix cache (equal ids at equal positions are equal tokens).

Errors use vLLM's body, `{"error": {"message", "type", "param", "code"}}`: 400
`BadRequestError` for a malformed body, `max_tokens` < 1, a prompt and output past the context,
or a request the scheduler can never serve; 404 `NotFoundError` for another model name (as vLLM
answers); 503 while shutting down.

Disaggregated prefill, after vLLM's NixlConnector proxy protocol (the subset a router needs):
* a `prefill` engine takes only requests with `kv_transfer_params.do_remote_decode: true`. It
  prefills the prompt, samples one token and answers (whatever `max_tokens` says) with that
  token, `finish_reason: "length"` and, in a non-streaming body, top-level
  `kv_transfer_params`: `{"do_remote_prefill": true, "do_remote_decode": false,
  "remote_engine_id", "remote_block_ids", "remote_host", "remote_port", "tp_size"}`;
* a `decode` engine takes only requests with `kv_transfer_params.do_remote_prefill: true` (the
  original request plus the prefill's `kv_transfer_params`). Their prompt is taken as computed
  remotely: the request holds its blocks while the KV crosses the link (the core's transfer
  time), then recomputes the last prompt token and generates all `max_tokens` tokens;
* an `aggregated` engine ignores `kv_transfer_params` and answers with `null` there.
Block ids are synthetic, and nothing is actually pulled from `remote_host`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from inferfleet.api.model_deployment import Role
from inferfleet.planning.memory import KV_BLOCK_TOKENS
from inferfleet.planning.performance import DEFAULT_EFFICIENCY, EfficiencyTerms
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.serving import serve_until_signalled
from inferfleet.sim.engine import EngineClosedError, RequestStream, SimEngine
from inferfleet.sim.kv_cache import blocks_for
from inferfleet.sim.scheduler import EngineRequest, RequestRejectedError

CHAT_TOKENS_PER_MESSAGE = 4
"""Template tokens around each chat message (Llama 3 wraps one in four special tokens)."""
DEFAULT_COMPLETION_MAX_TOKENS = 16
"""vLLM's (and OpenAI's) default `max_tokens` for `/v1/completions`."""
NIXL_SIDE_CHANNEL_HOST = "localhost"
NIXL_SIDE_CHANNEL_PORT = 5600
"""vLLM's defaults for where a decode replica reaches a prefill replica's NIXL agent."""

ENGINE: web.AppKey[SimEngine] = web.AppKey("engine", SimEngine)

_SSE_DONE = b"data: [DONE]\n\n"
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


class ApiError(Exception):
    """An error answered with vLLM's error body."""

    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": None,
                "code": self.status,
            }
        }

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status)


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What the emulator takes from an OpenAI request body."""

    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    prefix_hashes: tuple[int, ...]
    hash_block_tokens: int
    kv_transfer_params: Mapping[str, Any] | None
    model: str
    """The name the answer carries: the base model's or a LoRA adapter's, as asked."""


def _words(text: str) -> int:
    return len(text.split())


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def completion_prompt_tokens(prompt: object) -> int:
    """Tokens of a completions `prompt`: words of a string, or the length of a token list."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return _words(prompt)
    if isinstance(prompt, list) and all(_is_int(token) for token in prompt):
        return len(prompt)
    raise ApiError(
        "prompt must be a string or a list of token ids (batched prompts are not supported)"
    )


def chat_prompt_tokens(messages: object) -> int:
    """Tokens of a chat prompt: words of the text parts plus the template's per message."""
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages must be a non-empty list")
    tokens = 0
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError("each message must be an object with a string role")
        content = message.get("content")
        tokens += CHAT_TOKENS_PER_MESSAGE
        if isinstance(content, str):
            tokens += _words(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    tokens += _words(part["text"])
        elif content is not None:
            raise ApiError("message content must be a string, a list of parts or null")
    return tokens


def parse_request(
    body: object,
    *,
    chat: bool,
    model_name: str,
    context_limit: int,
    adapters: Collection[str] = (),
) -> ParsedRequest:
    """Validate an OpenAI request body as vLLM does for the fields the emulator uses. A LoRA
    adapter's name (`adapters`) is served as the base model: the emulator's timing leaves out
    the adapters' small extra work."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_name and model not in adapters:
        raise ApiError(f"The model `{model}` does not exist.", 404, "NotFoundError")
    n = body.get("n", 1)
    if n not in (None, 1):
        raise ApiError("only n=1 is supported by the engine emulator")

    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError("stream must be a boolean")
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise ApiError("Stream options can only be defined when `stream=True`.")
        if not isinstance(options, dict):
            raise ApiError("stream_options must be an object")
        include_usage = bool(options.get("include_usage", False))

    if chat:
        prompt_tokens = chat_prompt_tokens(body.get("messages"))
    else:
        if "prompt" not in body:
            raise ApiError("prompt is required")
        prompt_tokens = completion_prompt_tokens(body["prompt"])
    if prompt_tokens < 1:
        raise ApiError("The prompt cannot be empty.")
    if prompt_tokens >= context_limit:
        raise ApiError(
            f"This model's maximum context length is {context_limit} tokens. However, your "
            f"request has {prompt_tokens} input tokens. Please reduce the length of the input."
        )

    max_tokens: object = body.get("max_tokens")
    if chat and body.get("max_completion_tokens") is not None:
        max_tokens = body["max_completion_tokens"]
    if max_tokens is None:
        max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if not chat else context_limit - prompt_tokens
    if not _is_int(max_tokens):
        raise ApiError("max_tokens must be an integer")
    assert isinstance(max_tokens, int)
    if max_tokens < 1:
        raise ApiError(f"max_tokens must be at least 1, got {max_tokens}.")
    if prompt_tokens + max_tokens > context_limit:
        raise ApiError(
            f"This model's maximum context length is {context_limit} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the input, "
            f"{max_tokens} in the completion). Please reduce the length of the input or "
            "completion."
        )

    prefix_hashes: tuple[int, ...] = ()
    hash_block_tokens = KV_BLOCK_TOKENS
    extension = body.get("inferfleet")
    if extension is not None:
        if not isinstance(extension, dict):
            raise ApiError("inferfleet must be an object")
        hashes = extension.get("prefix_hashes", [])
        if not isinstance(hashes, list) or not all(_is_int(value) for value in hashes):
            raise ApiError("inferfleet.prefix_hashes must be a list of integers")
        prefix_hashes = tuple(hashes)
        block = extension.get("hash_block_tokens", KV_BLOCK_TOKENS)
        if not _is_int(block) or block < 1:
            raise ApiError("inferfleet.hash_block_tokens must be a positive integer")
        hash_block_tokens = block

    params = body.get("kv_transfer_params")
    if params is not None and not isinstance(params, dict):
        raise ApiError("kv_transfer_params must be an object")
    return ParsedRequest(
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        prefix_hashes=prefix_hashes,
        hash_block_tokens=hash_block_tokens,
        kv_transfer_params=params,
        model=model if isinstance(model, str) else model_name,
    )


def _failure(stream: RequestStream) -> ApiError | None:
    """The error for a request the engine ended without finishing it."""
    if stream.finish_reason == "abort":
        return ApiError(
            "the request was aborted: the engine is shutting down", 503, "ServiceUnavailableError"
        )
    if stream.finish_reason == "error":
        return ApiError("the engine failed", 500, "InternalServerError")
    return None


def token_text(index: int) -> str:
    """The synthetic text of output token `index` (1-based)."""
    return f" tok{index}"


class _Handlers:
    """Request handlers of one engine's API."""

    def __init__(
        self,
        engine: SimEngine,
        registry: CollectorRegistry,
        *,
        kv_host: str,
        kv_port: int,
        adapters: Sequence[str] = (),
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.adapters = tuple(adapters)
        self.context_limit = engine.config.context_limit
        self.engine_id = str(uuid.uuid4())
        self.kv_host = kv_host
        self.kv_port = kv_port
        self._next_block_id = 0
        self.created = int(time.time())

    # Informational endpoints.

    async def health(self, request: web.Request) -> web.Response:
        del request
        return web.Response(status=200 if self.engine.healthy else 503)

    async def models(self, request: web.Request) -> web.Response:
        del request
        name = self.engine.model_name
        models = [
            {
                "id": served,
                "object": "model",
                "created": self.created,
                "owned_by": "vllm",
                "root": served,
                "parent": None if served == name else name,
                "max_model_len": self.context_limit,
            }
            for served in (name, *self.adapters)
        ]
        return web.json_response({"object": "list", "data": models})

    async def metrics(self, request: web.Request) -> web.Response:
        del request
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    # Generation.

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        engine = self.engine
        try:
            try:
                body = json.loads(await request.read())
            except (ValueError, UnicodeDecodeError) as error:
                raise ApiError(f"invalid JSON body: {error}") from error
            parsed = parse_request(
                body, chat=chat, model_name=engine.model_name, context_limit=self.context_limit,
                adapters=self.adapters,
            )  # fmt: skip
            self._check_role(parsed)
            request_id = uuid.uuid4().hex
            try:
                stream = engine.add_request(
                    EngineRequest(
                        request_id,
                        parsed.prompt_tokens,
                        parsed.max_tokens,
                        parsed.prefix_hashes,
                        parsed.hash_block_tokens,
                    )
                )
            except RequestRejectedError as error:
                raise ApiError(str(error)) from error
            except EngineClosedError as error:
                raise ApiError(str(error), 503, "ServiceUnavailableError") from error
        except ApiError as error:
            return error.response()

        # Whatever ends the handler early (the client hanging up cancels it) aborts the request.
        try:
            response_id = ("chatcmpl-" if chat else "cmpl-") + request_id
            if parsed.stream:
                return await self._stream(request, stream, parsed, response_id, chat)
            await stream.wait(stream.max_tokens)
            failure = _failure(stream)
            if failure is not None:
                return failure.response()
            return web.json_response(self._full_body(stream, response_id, chat, parsed.model))
        finally:
            if not stream.done:
                engine.abort(request_id)

    def _check_role(self, parsed: ParsedRequest) -> None:
        params = parsed.kv_transfer_params or {}
        role = self.engine.role
        if role is Role.PREFILL and params.get("do_remote_decode") is not True:
            raise ApiError(
                "this is a prefill engine: requests need kv_transfer_params.do_remote_decode=true"
            )
        if role is Role.DECODE and params.get("do_remote_prefill") is not True:
            raise ApiError(
                "this is a decode engine: requests need kv_transfer_params.do_remote_prefill=true"
                " (from the prefill engine's response)"
            )

    def _usage(self, stream: RequestStream) -> dict[str, int]:
        return {
            "prompt_tokens": stream.prompt_tokens,
            "total_tokens": stream.prompt_tokens + stream.emitted,
            "completion_tokens": stream.emitted,
        }

    def _kv_transfer_params(self, stream: RequestStream) -> dict[str, Any] | None:
        if self.engine.role is not Role.PREFILL:
            return None
        blocks = blocks_for(stream.prompt_tokens)
        first = self._next_block_id
        self._next_block_id += blocks
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_block_ids": list(range(first, first + blocks)),
            "remote_host": self.kv_host,
            "remote_port": self.kv_port,
            "tp_size": self.engine.config.tensor,
        }

    def _full_body(
        self, stream: RequestStream, response_id: str, chat: bool, model: str
    ) -> dict[str, Any]:
        text = "".join(token_text(index) for index in range(1, stream.emitted + 1))
        choice: dict[str, Any]
        if chat:
            choice = {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning_content": None,
                },
                "logprobs": None,
                "finish_reason": stream.finish_reason,
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": stream.finish_reason,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        return {
            "id": response_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": self._usage(stream),
            "prompt_logprobs": None,
            "kv_transfer_params": self._kv_transfer_params(stream),
        }

    async def _stream(
        self,
        request: web.Request,
        stream: RequestStream,
        parsed: ParsedRequest,
        response_id: str,
        chat: bool,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        chunks = _SseChunks.build(response_id, json.dumps(parsed.model), chat)
        try:
            await self._write_events(response, stream, parsed.include_usage, chunks)
        except ConnectionResetError:
            return response  # the client hung up; the caller aborts the request
        await response.write_eof()
        return response

    async def _write_events(
        self,
        response: web.StreamResponse,
        stream: RequestStream,
        include_usage: bool,
        chunks: _SseChunks,
    ) -> None:
        """Write each wake-up's new tokens in one go: a slow reader gets bigger writes."""
        sent = 0
        last = stream.max_tokens
        head, tail, last_tail = chunks.head, chunks.tail, chunks.last_tail
        while True:
            emitted = await stream.wait(sent)
            failure = _failure(stream)
            if failure is not None:
                # vLLM's streamed error: an error object as the last event.
                await response.write(
                    b"data: " + json.dumps(failure.body()).encode() + b"\n\n" + _SSE_DONE
                )
                return
            parts: list[str] = []
            if sent == 0 and chunks.role:
                parts.append(chunks.role)
            for index in range(sent + 1, emitted + 1):
                parts.append(f"{head}{index}{last_tail if index == last else tail}")
            sent = emitted
            if stream.done:
                if include_usage:
                    usage = json.dumps(self._usage(stream), separators=(",", ":"))
                    parts.append(f'{chunks.envelope}],"usage":{usage}}}\n\n')
                await response.write("".join(parts).encode() + _SSE_DONE)
                return
            await response.write("".join(parts).encode())


@dataclass(frozen=True, slots=True)
class _SseChunks:
    """One stream's event templates. A token's event is `head`, its index and a tail: no JSON
    encoding per token."""

    envelope: str
    """`data: {"id":...,"choices":[`, shared by every event of the stream."""
    head: str
    tail: str
    last_tail: str
    """The tail of the last token, which carries the finish reason."""
    role: str
    """Chat only: the event that opens the assistant message, sent with the first token."""

    @classmethod
    def build(cls, response_id: str, model_json: str, chat: bool) -> _SseChunks:
        kind = "chat.completion.chunk" if chat else "text_completion"
        envelope = (
            f'data: {{"id":"{response_id}","object":"{kind}","created":{int(time.time())},'
            f'"model":{model_json},"choices":['
        )
        if chat:
            return cls(
                envelope=envelope,
                head=envelope + '{"index":0,"delta":{"content":" tok',
                tail='"},"logprobs":null,"finish_reason":null}]}\n\n',
                last_tail='"},"logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n',
                role=envelope + '{"index":0,"delta":{"role":"assistant","content":""},'
                '"logprobs":null,"finish_reason":null}]}\n\n',
            )
        return cls(
            envelope=envelope,
            head=envelope + '{"index":0,"text":" tok',
            tail='","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n',
            last_tail='","logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n',
            role="",
        )


def create_app(
    config: ReplicaConfig,
    model_name: str,
    role: Role = Role.AGGREGATED,
    *,
    efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY,
    prefix_caching: bool = True,
    kv_transfer_bytes_per_s: float | None = None,
    kv_capacity_blocks: int | None = None,
    kv_host: str = NIXL_SIDE_CHANNEL_HOST,
    kv_port: int = NIXL_SIDE_CHANNEL_PORT,
    api_key: str | None = None,
    adapters: Sequence[str] = (),
) -> web.Application:
    """An aiohttp application serving one emulated engine; the engine runs while the app does.

    `kv_host`/`kv_port` are what a prefill engine advertises in `kv_transfer_params`. With
    `api_key`, every /v1 path takes only `Authorization: Bearer <api_key>` and answers 401
    otherwise, as vLLM's server does with `--api-key`; /health and /metrics stay open.
    `adapters` are LoRA adapter names served beside `model_name`, as vLLM's `--lora-modules`.
    Run it with handler cancellation on (as `SimServer` does) so that a client hanging up
    aborts its request."""
    engine = SimEngine(
        config,
        model_name,
        role,
        efficiency=efficiency,
        prefix_caching=prefix_caching,
        kv_transfer_bytes_per_s=kv_transfer_bytes_per_s,
        kv_capacity_blocks=kv_capacity_blocks,
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(engine.metrics)
    handlers = _Handlers(engine, registry, kv_host=kv_host, kv_port=kv_port, adapters=adapters)

    middlewares = [] if api_key is None else [_bearer_only(api_key)]
    app = web.Application(client_max_size=64 * 1024**2, middlewares=middlewares)
    app[ENGINE] = engine
    app.router.add_post("/v1/completions", handlers.completions)
    app.router.add_post("/v1/chat/completions", handlers.chat_completions)
    app.router.add_get("/v1/models", handlers.models)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/metrics", handlers.metrics)

    async def start_engine(app: web.Application) -> None:
        app[ENGINE].start()

    async def stop_accepting(app: web.Application) -> None:
        app[ENGINE].stop_accepting()

    async def close_engine(app: web.Application) -> None:
        await app[ENGINE].close()

    app.on_startup.append(start_engine)
    app.on_shutdown.append(stop_accepting)
    app.on_cleanup.append(close_engine)
    return app


def _bearer_only(api_key: str) -> Any:
    expected = f"Bearer {api_key}"

    @web.middleware
    async def bearer_only(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/v1") and not hmac.compare_digest(
            request.headers.get("Authorization", ""), expected
        ):
            return web.json_response({"error": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    return bearer_only


class SimServer:
    """An emulated engine listening on a TCP port, with a graceful stop."""

    def __init__(
        self,
        app: web.Application,
        host: str = "0.0.0.0",
        port: int = 8000,
        *,
        drain_timeout_s: float = 30.0,
        access_log: bool = False,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        kwargs: dict[str, Any] = {} if access_log else {"access_log": None}
        # Handler cancellation: a client that hangs up cancels its handler, which aborts the
        # request. shutdown_timeout: how long in-flight requests may run on after a stop.
        self._runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=drain_timeout_s, **kwargs
        )
        self._stopped = False

    @property
    def engine(self) -> SimEngine:
        return self.app[ENGINE]

    async def start(self) -> int:
        """Listen; the bound port (useful with `port=0`)."""
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        address = self._runner.addresses[0]
        self.port = int(address[1])
        return self.port

    async def stop(self) -> None:
        """Stop listening, let in-flight requests finish within the drain timeout, abort the
        rest and stop the engine. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self.engine.stop_accepting()
        await self._runner.cleanup()


async def serve(
    config: ReplicaConfig,
    model_name: str,
    role: Role = Role.AGGREGATED,
    *,
    host: str = "0.0.0.0",
    port: int = 8000,
    drain_timeout_s: float = 30.0,
    access_log: bool = False,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[int], None] | None = None,
    **engine_options: Any,
) -> None:
    """Serve one emulated engine until SIGTERM/SIGINT (or `stop` is set), then shut down
    gracefully. `engine_options` go to `create_app`; `on_ready` gets the bound port."""
    app = create_app(config, model_name, role, **engine_options)
    server = SimServer(app, host, port, drain_timeout_s=drain_timeout_s, access_log=access_log)
    await serve_until_signalled(server.start, server.stop, stop=stop, on_ready=on_ready)


def run(
    config: ReplicaConfig,
    model_name: str,
    role: Role = Role.AGGREGATED,
    **options: Any,
) -> None:
    """Blocking entry point: `serve` on a fresh event loop."""
    asyncio.run(serve(config, model_name, role, **options))
