"""Errors in the OpenAI API's shape, as the router answers them and as engines do."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from aiohttp import web


def error_body(message: str, status: int, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def error_response(
    message: str, status: int, kind: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(error_body(message, status, kind), status=status, headers=headers)


def message_of(answer: bytes, fallback: str) -> str:
    """The message of an engine's error answer, or `fallback`."""
    with contextlib.suppress(ValueError, TypeError, KeyError):
        return str(json.loads(answer)["error"]["message"])
    return fallback
