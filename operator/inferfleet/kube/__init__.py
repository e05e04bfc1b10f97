"""The one module of the operator that talks to the Kubernetes API (through the official
client). What only the dev cluster's kubelets ask of it is in `devcluster.kubelet_api`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError
from kubernetes.utils import parse_quantity

WATCH_REQUEST_S = 300
"""How long one watch request lasts before the next resumes it (the API server's own default
is 30 to 60 minutes; a shorter one finds a connection that died silently sooner)."""
WATCH_CONNECT_S = 10
WATCH_SILENCE_S = 30
"""How long past a watch request's own end its connection may stay silent."""

FIELD_MANAGER = "inferfleet-operator"
"""The one field manager of everything inferfleet applies (what the operator always applied
under, so objects it owns keep one owner of their fields)."""


class StaleObjectError(Exception):
    """The object changed since it was read: a write made from that read would undo the other."""


class AlreadyExistsError(Exception):
    """An object of that name exists: a create-only apply left it as it was."""


class RefusedError(Exception):
    """The API server, or an admission check it runs (a quota, a policy webhook, RBAC), refused
    the object: sent again unchanged, it is refused again until something else changes. The
    message is the server's."""


# Answers that refuse the object itself, where 409 (a conflict), 429 and 5xx pass with time.
_REFUSING_STATUSES = frozenset({400, 403, 422})


def _refusal(error: ApiException) -> RefusedError | None:
    if error.status not in _REFUSING_STATUSES:
        return None
    message = str(error.reason)
    try:
        answer = json.loads(error.body or "")
    except ValueError:
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("message"), str):
        message = answer["message"]
    return RefusedError(message)


CREATE_ONLY_PRECONDITION = "1"
"""A resourceVersion no stored object has (etcd's first write is revision 2): as an apply's
precondition, an object that exists fails it (409), and one being created ignores it. An apply
that may only create, in one request."""


def quantity(text: str) -> Decimal:
    """A resource quantity as the API server writes it ("4", "500m", "16Gi"), as a number;
    ValueError for one that is not."""
    parsed: Decimal = parse_quantity(text)  # type: ignore[no-untyped-call]
    return parsed


def _wire(response: Any) -> dict[str, Any]:
    """The JSON an API call answered, as it came: the dynamic client's `ResourceInstance`
    wrapper, built field by field and walked back by `to_dict()`, cost more CPU than the
    request itself."""
    decoded: dict[str, Any] = json.loads(response.data)
    return decoded


class NoConfigurationError(Exception):
    """Neither a pod's service account nor a kubeconfig to reach an API server with."""


class Kube:
    """Objects go in and come out as plain dicts (the wire form), through the dynamic client."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self._dynamic: DynamicClient | None = None
        # The dynamic client's discovery cache is not thread-safe (a lookup that misses
        # rebuilds it in place), and kopf runs handlers and timers on a pool of threads.
        self._discovery = threading.Lock()

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Kube:
        api_client: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(path)
        )
        return cls(api_client)

    @classmethod
    def from_environment(cls, *, connections: int | None = None) -> Kube:
        """In a pod: its service account. Elsewhere: $KUBECONFIG or ~/.kube/config.
        `connections`: how many requests may be open at once (one per thread that calls); the
        client's own default is five per CPU, and a connection beyond the pool is closed after
        its request, so the next one pays a TLS handshake again.

        Raises `NoConfigurationError` when there is neither."""
        configuration = client.Configuration()
        if connections is not None:
            configuration.connection_pool_maxsize = connections
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            try:
                config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            except (config.ConfigException, OSError) as error:
                raise NoConfigurationError(
                    "no Kubernetes configuration: not in a pod (no service account), and no "
                    f"usable kubeconfig (set KUBECONFIG or write ~/.kube/config): {error}"
                ) from None
        return cls(client.ApiClient(configuration))

    @property
    def dynamic(self) -> DynamicClient:
        # Discovery costs a round of requests: only when a generic call needs it.
        with self._discovery:
            if self._dynamic is None:
                self._dynamic = DynamicClient(self.api_client)  # type: ignore[no-untyped-call]
            return self._dynamic

    def resource(self, api_version: str, kind: str) -> Any:
        """The dynamic client's resource of a kind, for calls the methods here do not make."""
        dynamic = self.dynamic
        with self._discovery:
            return dynamic.resources.get(api_version=api_version, kind=kind)

    def serves(self, api_version: str, kind: str) -> bool | None:
        """Whether the API server serves the kind (a custom resource whose CRD is installed);
        None when discovery could not be read. Asking about one it does not serve reads its
        discovery afresh."""
        try:
            self.resource(api_version, kind)
        except ResourceNotFoundError:
            return False
        except (ApiException, urllib3.exceptions.HTTPError):
            return None
        return True

    def list(
        self, api_version: str, kind: str, namespace: str | None = None, **selectors: str
    ) -> list[dict[str, Any]]:
        found = self.resource(api_version, kind).get(
            namespace=namespace, serialize=False, **selectors
        )
        items: list[dict[str, Any]] = _wire(found)["items"]
        return items

    def list_and_watch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        label_selector: str,
        for_s: float | None = None,
        *,
        field_selector: str | None = None,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """What matches now (`("LISTED", object)` each, then `("SYNCED", {})`), then its
        changes (`ADDED`, `MODIFIED`, `DELETED`) for `for_s` seconds (None: for as long as it
        is iterated). Each watch request resumes from the last version seen, which bookmarks
        keep current while nothing matching changes, so nothing is listed twice; a version the
        API server no longer holds (410 Gone, after a long disconnection) raises `ApiException`:
        list again. With `field_selector`, an object that stops matching it is `DELETED`."""
        resource = self.resource(api_version, kind)
        selectors = {"label_selector": label_selector}
        if field_selector:
            selectors["field_selector"] = field_selector
        listed = _wire(resource.get(namespace=namespace, serialize=False, **selectors))
        for item in listed["items"]:
            # A list's items carry no kind (its own does): as a watch's objects carry it.
            yield "LISTED", {"apiVersion": api_version, "kind": kind, **item}
        yield "SYNCED", {}
        version = str(listed["metadata"]["resourceVersion"])
        deadline = None if for_s is None else time.monotonic() + for_s
        while True:
            left = WATCH_REQUEST_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return
            # The watch's own stream, not the dynamic client's `watch`: that wraps every
            # event's object in a `ResourceInstance`, at seven times the CPU of decoding it. An
            # ERROR event (410 Gone among them) is raised by the stream as an `ApiException`.
            for event in watch.Watch().stream(  # type: ignore[no-untyped-call]
                resource.get,
                namespace=namespace,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=max(1, int(min(left, WATCH_REQUEST_S))),
                # A connection that died without a word ends the read instead of blocking it
                # for good: bookmarks come about once a minute on a live one.
                _request_timeout=(WATCH_CONNECT_S, WATCH_REQUEST_S + WATCH_SILENCE_S),
                serialize=False,
                **selectors,
            ):
                obj: dict[str, Any] = event["raw_object"]
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if event["type"] != "BOOKMARK":
                    yield str(event["type"]), obj

    def get(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        timeout_s: float | None = None,
    ) -> dict[str, Any] | None:
        """One object, None when there is none; `timeout_s` bounds the request (None: the
        client's default, no bound)."""
        try:
            found = self.resource(api_version, kind).get(
                name=name, namespace=namespace, serialize=False, _request_timeout=timeout_s
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return _wire(found)

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None) -> None:
        """Delete one object and, in the background, what it owns (as kubectl does: a
        batch/v1 Job's own default orphans its pods); already gone is fine."""
        try:
            self.resource(api_version, kind).delete(
                name=name, namespace=namespace, body={"propagationPolicy": "Background"}
            )
        except ApiException as error:
            if error.status == 404:
                return
            if (refused := _refusal(error)) is not None:
                raise refused from error
            raise

    def patch_status(
        self, obj: dict[str, Any], status: dict[str, Any], *, if_unchanged: bool = False
    ) -> dict[str, Any]:
        """Merge `status` into the object's status subresource (lists are replaced whole);
        returns the object as stored.

        `if_unchanged`: only if the object is still at the resourceVersion it was read at
        (optimistic concurrency), else `StaleObjectError`. For status that several writers
        share, such as a list of conditions that each write one entry of.
        """
        body: dict[str, Any] = {"status": status}
        if if_unchanged:
            body["metadata"] = {"resourceVersion": obj["metadata"]["resourceVersion"]}
        resource = self.resource(obj["apiVersion"], obj["kind"])
        try:
            stored = resource.status.patch(
                body=body,
                name=obj["metadata"]["name"],
                namespace=obj["metadata"].get("namespace"),
                content_type="application/merge-patch+json",
                serialize=False,
            )
        except ApiException as error:
            if if_unchanged and error.status == 409:
                raise StaleObjectError(str(error.reason)) from error
            raise
        return _wire(stored)

    def merge_patch(
        self, api_version: str, kind: str, name: str, namespace: str | None, body: dict[str, Any]
    ) -> None:
        """Merge `body` into one object (JSON merge patch: lists are replaced whole)."""
        try:
            self.resource(api_version, kind).patch(
                body=body,
                name=name,
                namespace=namespace,
                content_type="application/merge-patch+json",
                serialize=False,
            )
        except ApiException as error:
            if (refused := _refusal(error)) is not None:
                raise refused from error
            raise

    def _resource_of(self, obj: dict[str, Any]) -> tuple[Any, str | None]:
        """The object's resource, and its namespace where the kind has one."""
        resource = self.resource(obj["apiVersion"], obj["kind"])
        return resource, obj["metadata"].get("namespace") if resource.namespaced else None

    def create(self, obj: dict[str, Any]) -> bool:
        """Create one object; False when one of its name is already there (left as it is)."""
        resource, namespace = self._resource_of(obj)
        try:
            resource.create(body=obj, namespace=namespace)
        except ApiException as error:
            if error.status == 409:
                return False
            if (refused := _refusal(error)) is not None:
                raise refused from error
            raise
        return True

    def apply(
        self, obj: dict[str, Any], field_manager: str = FIELD_MANAGER, *, create_only: bool = False
    ) -> dict[str, Any]:
        """Server-side apply of one object; returns what the API server stored.

        `create_only`: only if no object of its name exists, else `AlreadyExistsError`."""
        resource, namespace = self._resource_of(obj)
        if create_only:
            metadata = {**obj["metadata"], "resourceVersion": CREATE_ONLY_PRECONDITION}
            obj = {**obj, "metadata": metadata}
        # force: the operator owns what it renders, even fields another manager once set.
        try:
            applied = resource.server_side_apply(
                body=obj,
                field_manager=field_manager,
                namespace=namespace,
                force_conflicts=True,
                serialize=False,
            )
        except ApiException as error:
            if create_only and error.status == 409:
                raise AlreadyExistsError(str(error.reason)) from error
            if (refused := _refusal(error)) is not None:
                raise refused from error
            raise
        return _wire(applied)
