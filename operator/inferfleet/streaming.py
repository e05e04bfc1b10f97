"""Reading an OpenAI-compatible server-sent event stream as tokens arrive.

Pure: the caller feeds bytes with the time it received them. The load generator times its
requests with it and the router measures each request's TTFT and TPOT with it, so both see a
stream the same way:
* a content event (a `choices[0].text` or `choices[0].delta.content` that is not empty)
  counts one chunk; the first one is the first token;
* the usage event (`stream_options.include_usage`) gives the exact token counts, which win
  over counted chunks (an engine may put several tokens in one event);
* an event with a top-level `error` ends the stream in failure (vLLM's way to fail a stream
  that has started); `data: [DONE]` ends it.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Mapping
from typing import Any

DONE_EVENT = b"data: [DONE]\n\n"


def is_plain_token(payload: bytes) -> bool:
    """A chunk that certainly carries text and nothing else of interest, told without
    decoding it (JSON decoding is a large part of a token's cost). Compact JSON only, as
    vLLM writes it; anything else is decoded. Markers inside a string value would be escaped
    (`\\"`), so they cannot be faked by the text."""
    if b'"error"' in payload or b'"usage"' in payload:
        return False
    if b'"text":"' in payload:
        return b'"text":""' not in payload
    if b'"content":"' in payload:
        return b'"content":""' not in payload
    return False


def has_content(chunk: Mapping[str, Any]) -> bool:
    choices = chunk.get("choices")
    if not choices or not isinstance(choices, list):
        return False
    choice = choices[0]
    if not isinstance(choice, dict):
        return False
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and bool(delta.get("content"))


def error_message(body: Mapping[str, Any]) -> str:
    """The `error.message` of an OpenAI error body, else the body as JSON."""
    error = body.get("error")
    if isinstance(error, dict):
        message = error.get("message")
        if isinstance(message, str):
            return message
    return json.dumps(body)


class TokenStream:
    """One streamed answer, fed as its bytes arrive.

    `feed` returns the complete events of what it was given, as bytes to pass on (a partial
    event waits for the rest); with `drop_usage` the usage event is left out of them, for a
    proxy that asked for usage on a client's behalf. `gaps`, when given, collects the seconds
    between consecutive content chunks."""

    __slots__ = (
        "_pending",
        "chunks",
        "done",
        "drop_usage",
        "error",
        "first_token_at",
        "gaps",
        "last_token_at",
        "usage_completion_tokens",
        "usage_prompt_tokens",
    )

    def __init__(self, *, drop_usage: bool = False, gaps: array[float] | None = None) -> None:
        self._pending = b""
        self.drop_usage = drop_usage
        self.gaps = gaps
        self.chunks = 0
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.usage_completion_tokens: int | None = None
        self.usage_prompt_tokens: int | None = None
        self.error: str | None = None
        self.done = False

    @property
    def tokens(self) -> int:
        """Output tokens: the usage event's count, else the content chunks counted."""
        return self.chunks if self.usage_completion_tokens is None else self.usage_completion_tokens

    def tpot_s(self) -> float | None:
        if self.first_token_at is None or self.last_token_at is None or self.tokens < 2:
            return None
        return (self.last_token_at - self.first_token_at) / (self.tokens - 1)

    def feed(self, data: bytes, now: float) -> bytes:
        if not self._pending and self._only_tokens(data):
            # The common case, a read of whole token events and nothing else: count, don't parse.
            self._count_tokens(data.count(b"data:"), now)
            return data
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        *events, self._pending = (self._pending + data).split(b"\n\n")
        if not events:
            return b""
        kept: list[bytes] = []
        for event in events:
            if self._read_event(event, now):
                kept.append(event)
        if not kept:
            return b""
        return b"\n\n".join(kept) + b"\n\n"

    @staticmethod
    def _only_tokens(data: bytes) -> bool:
        if not data.endswith(b"\n\n") or b"\r" in data:
            return False
        if b'"usage"' in data or b'"error"' in data or b"[DONE]" in data:
            return False
        if b'"text":""' in data or b'"content":""' in data:
            return False
        events = data.count(b"data:")
        texts = data.count(b'"text":"') + data.count(b'"content":"')
        return events > 0 and texts == events and data.count(b"\n\n") == events

    def _count_tokens(self, count: int, now: float) -> None:
        if self.first_token_at is None:
            self.first_token_at = now
            count -= 1
            self.chunks += 1
        if count > 0:
            if self.gaps is not None:
                self.gaps.append(now - (self.last_token_at or now))
                self.gaps.extend([0.0] * (count - 1))
            self.chunks += count
        self.last_token_at = now

    def _read_event(self, event: bytes, now: float) -> bool:
        """Account for one event; whether to pass it on."""
        keep = True
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue  # comments, event names, keep-alives
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            chunk: Any = None
            if is_plain_token(payload):
                content = True
            else:
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    continue
                if not isinstance(chunk, dict):
                    continue
                if "error" in chunk:
                    self.error = error_message(chunk)
                    continue
                content = has_content(chunk)
            if content:
                self._count_tokens(1, now)
            usage = None if chunk is None else chunk.get("usage")
            if isinstance(usage, dict):
                if isinstance(usage.get("completion_tokens"), int):
                    self.usage_completion_tokens = usage["completion_tokens"]
                if isinstance(usage.get("prompt_tokens"), int):
                    self.usage_prompt_tokens = usage["prompt_tokens"]
                if self.drop_usage and not content:
                    keep = False
        return keep
