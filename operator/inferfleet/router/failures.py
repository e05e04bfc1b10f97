"""How a request's call to the replicas fails, as the proxy tells it apart: no replica
served it, the client hung up (not the replica's fault), or the replicas failed before
anything reached the client."""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from inferfleet.api.model_deployment import Role


class NoReplicaError(Exception):
    """No replica of a role served the request: none healthy (`failures` empty), or each one
    tried failed, for the reason its entry gives (no address: the client reads them)."""

    def __init__(self, role: Role, failures: Sequence[str]) -> None:
        super().__init__(role, failures)
        self.role = role
        self.failures = tuple(failures)

    def message(self) -> str:
        return f"every {self.role.value} replica tried failed ({len(self.failures)}): " + "; ".join(
            self.failures
        )


def refused_keys(keys: int) -> str:
    if keys > 1:
        return f"refused each of the router's {keys} engine keys (401)"
    return "refused the router's engine key (401)" if keys else "refused the call (401)"


def broke(error: BaseException) -> str:
    return f"the call broke ({type(error).__name__})"


class ClientGoneError(Exception):
    """Writing to the client failed: it hung up. The replica did nothing wrong."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__("the client hung up")
        self.response = response


class UpstreamFailedError(Exception):
    """A replica call failed after the retries, before anything reached the client."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
