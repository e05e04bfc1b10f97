"""What the router reads from an OpenAI request body, and how it rewrites it for the prefill
-> decode hand-off. Pure.

The router does not tokenize: it estimates a prompt from its characters (a list of token ids
counts exactly), which is all load balancing and the arrivals' prompt-token counter need, and
takes the exact counts from the engine's usage report for its metrics. Characters per token
start at `CHARS_PER_TOKEN` and are learned from those reports (`CharsPerToken`): text and
tokenizers differ (single-token English words run about 5.5 characters with their space), and
a fixed ratio would misstate every arriving prompt by as much.

Prefix blocks, for affinity: the `inferfleet.prefix_hashes` extension when the client sends
it (already chained block ids), else chained hashes of the prompt text in blocks of
`PREFIX_BLOCK_CHARS` characters (about one engine KV block group of 128 tokens).

Hand-off protocols of a disaggregated pair:
* vLLM (and the `sim` engine), NixlConnector's proxy protocol: the prefill request is the
  client's with `stream: false`, `max_tokens: 1` and `kv_transfer_params.do_remote_decode:
  true`; its answer's `kv_transfer_params` go into the decode request, which is otherwise the
  client's own;
* TensorRT-LLM, `trtllm-serve`'s disaggregated protocol: the context request carries
  `disaggregated_params.request_type: "context_only"` and `stream: false`; its answer's
  `choices[0].disaggregated_params`, with `request_type: "generation_only"`, go into the
  generation request.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferfleet.api.model_deployment import EngineName
from inferfleet.router.config import LONGEST_CONTEXT

CHARS_PER_TOKEN = 4
PREFIX_BLOCK_CHARS = 512
PREFIX_BLOCKS = 64
"""Leading blocks of a prompt hashed for affinity (`balancer.PrefixIndex.max_blocks` looks at
no more): a long prompt costs no more to hash than 32 KiB of it."""
DEFAULT_MAX_TOKENS_ESTIMATE = 256
"""Output tokens assumed for load when a chat request sets no limit."""
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


class BadRequestError(ValueError):
    """A body the router cannot route; answered 400 with this message."""


class HandoffError(RuntimeError):
    """A prefill answer without what the decode side needs."""


@dataclass(frozen=True, slots=True)
class RoutedRequest:
    body: dict[str, Any]
    chat: bool
    stream: bool
    client_wants_usage: bool
    prompt_tokens_estimate: int
    max_tokens_estimate: int
    prefix_blocks: tuple[int, ...]
    prompt_chars: int | None = None
    """The prompt text's length, for learning characters per token; None for token ids."""
    model: str | None = None
    """The served model name the client asked for; None when it named none."""


class CharsPerToken:
    """Characters per prompt token, learned from the engines' exact counts: sums that decay by
    `1 - 1 / memory` per report, so the ratio follows a change of traffic within a few
    `memory` requests, and no single odd prompt moves it far."""

    def __init__(self, memory: int = 256, low: float = 1.0, high: float = 16.0) -> None:
        self._keep = 1 - 1 / memory
        self._bounds = (low, high)
        self._chars = 0.0
        self._tokens = 0.0

    @property
    def value(self) -> float:
        if self._tokens <= 0:
            return float(CHARS_PER_TOKEN)
        low, high = self._bounds
        return min(high, max(low, self._chars / self._tokens))

    def observe(self, chars: int, tokens: int) -> None:
        if chars <= 0 or tokens <= 0:
            return
        self._chars = self._chars * self._keep + chars
        self._tokens = self._tokens * self._keep + tokens


def _text_of(body: Mapping[str, Any], chat: bool) -> tuple[str, int | None]:
    """The prompt's text, or its exact length when it is a list of token ids."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequestError("messages must be a non-empty list")
        parts: list[str] = []
        for message in messages:
            if not isinstance(message, dict):
                raise BadRequestError("each message must be an object")
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(
                    part["text"]
                    for part in content
                    if isinstance(part, dict) and isinstance(part.get("text"), str)
                )
        return "\n".join(parts), None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and all(isinstance(token, int) for token in prompt):
        return "", len(prompt)
    raise BadRequestError("prompt must be a string or a list of token ids")


def _chained_hashes(text: str) -> tuple[int, ...]:
    blocks: list[int] = []
    previous = b""
    # A character is at least a byte: this many characters hold the blocks hashed.
    encoded = text[: PREFIX_BLOCK_CHARS * PREFIX_BLOCKS].encode()[
        : PREFIX_BLOCK_CHARS * PREFIX_BLOCKS
    ]
    for start in range(0, len(encoded) - PREFIX_BLOCK_CHARS + 1, PREFIX_BLOCK_CHARS):
        digest = hashlib.blake2b(
            previous + encoded[start : start + PREFIX_BLOCK_CHARS], digest_size=8
        ).digest()
        blocks.append(int.from_bytes(digest, "big"))
        previous = digest
    return tuple(blocks)


def read_request(
    body: object,
    *,
    chat: bool,
    chars_per_token: float = CHARS_PER_TOKEN,
    longest_context: int = LONGEST_CONTEXT,
) -> RoutedRequest:
    """What the router needs of a body. Token estimates are integers no larger than
    `longest_context` (no replica works for more tokens than its context holds, whatever
    `max_tokens` says), so a replica's load adds and subtracts back exactly."""
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequestError("model must be a string")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequestError("stream must be a boolean")
    options = body.get("stream_options")
    wants_usage = isinstance(options, dict) and options.get("include_usage") is True
    text, exact_tokens = _text_of(body, chat)
    prompt_tokens = (
        exact_tokens if exact_tokens is not None else int(len(text) / chars_per_token) + 1
    )
    limit = body.get("max_completion_tokens") if chat else None
    if limit is None:
        limit = body.get("max_tokens")
    if limit is None:
        limit = DEFAULT_MAX_TOKENS_ESTIMATE if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise BadRequestError("max_tokens must be an integer")
    extension = body.get("inferfleet")
    hashes = extension.get("prefix_hashes") if isinstance(extension, dict) else None
    if isinstance(hashes, list) and all(isinstance(value, int) for value in hashes):
        prefix_blocks = tuple(hashes)
    else:
        prefix_blocks = _chained_hashes(text)
    return RoutedRequest(
        body=body,
        chat=chat,
        stream=stream,
        client_wants_usage=wants_usage,
        prompt_tokens_estimate=min(prompt_tokens, longest_context),
        max_tokens_estimate=min(max(1, limit), longest_context),
        prefix_blocks=prefix_blocks,
        prompt_chars=len(text) if exact_tokens is None else None,
        model=model,
    )


def upstream_body(request: RoutedRequest) -> dict[str, Any]:
    """The body sent to the serving replica: a stream always reports usage, so the router
    counts tokens exactly (the usage event is dropped again when the client did not ask)."""
    if not request.stream or request.client_wants_usage:
        return request.body
    body = dict(request.body)
    options = body.get("stream_options")
    body["stream_options"] = {
        **(options if isinstance(options, dict) else {}),
        "include_usage": True,
    }
    return body


def prefill_body(engine: EngineName, body: Mapping[str, Any]) -> dict[str, Any]:
    """The request for the prefill replica."""
    prefill = dict(body)
    prefill["stream"] = False
    prefill.pop("stream_options", None)
    if engine is EngineName.TENSORRT_LLM:
        prefill["disaggregated_params"] = {"request_type": "context_only"}
        return prefill
    prefill["max_tokens"] = 1
    if "max_completion_tokens" in prefill:
        prefill["max_completion_tokens"] = 1
    prefill["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    return prefill


def decode_body(
    engine: EngineName, body: Mapping[str, Any], prefill_answer: object
) -> dict[str, Any]:
    """The request for the decode replica, carrying what the prefill answer handed over."""
    if not isinstance(prefill_answer, dict):
        raise HandoffError("the prefill replica's answer is not a JSON object")
    decode = dict(body)
    if engine is EngineName.TENSORRT_LLM:
        choices = prefill_answer.get("choices")
        params = (
            choices[0].get("disaggregated_params")
            if isinstance(choices, list) and choices and isinstance(choices[0], dict)
            else None
        )
        if not isinstance(params, dict):
            raise HandoffError("the context answer has no choices[0].disaggregated_params")
        decode["disaggregated_params"] = {
            **copy.deepcopy(params),
            "request_type": "generation_only",
        }
        return decode
    params = prefill_answer.get("kv_transfer_params")
    if not isinstance(params, dict):
        raise HandoffError("the prefill answer has no kv_transfer_params")
    decode["kv_transfer_params"] = copy.deepcopy(params)
    return decode
