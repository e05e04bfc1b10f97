"""Where a backend's replicas are, found through the Kubernetes API in one of two ways.

`endpointslices` (the default): the ready endpoints of its Service's EndpointSlices. The
router lists and watches the EndpointSlices labelled `kubernetes.io/service-name` with its
backends' Services in its namespace (it needs `get`, `list` and `watch` on
`discovery.k8s.io/endpointslices` there) and routes to the ready addresses, on the port named
`http` of the slice (else the backend's port).

`pods`: the Ready pods its Service's selector picks, at the pod IP and the backend's port
(it needs `get`, `list` and `watch` on `services` and `pods`). For clusters whose pod
addresses EndpointSlices refuse: the dev cluster gives pods loopback addresses. Selectors are
read again at each re-list, so a changed one takes effect within a watch timeout.

Either watch runs on a thread of its own through the official client, re-listing after each
watch timeout and backing off when the API server cannot be reached; each change is handed to
the router's event loop. Backends given with `urls=` are fixed and need no discovery.
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from inferfleet.api.model_deployment import Role
from inferfleet.engines import PORT_NAME
from inferfleet.kube import Kube
from inferfleet.kube.reflector import until_stopped
from inferfleet.router.config import Backend, DiscoveryMode, RouterConfig
from inferfleet.router.proxy import Discovery, Router

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def ready_urls(slices: Iterable[Mapping[str, Any]], default_port: int) -> list[str]:
    """The URLs of the ready endpoints of a Service's EndpointSlices (an unset `ready`
    counts as ready, as the API says)."""
    urls: set[str] = set()
    for endpoint_slice in slices:
        if endpoint_slice.get("addressType") not in ("IPv4", "IPv6"):
            continue
        port = default_port
        for candidate in endpoint_slice.get("ports") or []:
            if candidate.get("name") == PORT_NAME and candidate.get("port"):
                port = int(candidate["port"])
        ipv6 = endpoint_slice["addressType"] == "IPv6"
        for endpoint in endpoint_slice.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            if conditions.get("ready") is False:
                continue
            for address in endpoint.get("addresses") or []:
                host = f"[{address}]" if ipv6 else address
                urls.add(f"http://{host}:{port}")
    return sorted(urls)


def selects(selector: Mapping[str, str] | None, labels: Mapping[str, str]) -> bool:
    """Whether a Service's selector picks a pod with these labels (a Service without a
    selector picks none: its endpoints are managed by hand)."""
    return bool(selector) and all(
        labels.get(key) == value for key, value in (selector or {}).items()
    )


def pod_is_ready(pod: Mapping[str, Any]) -> bool:
    """Running, not being deleted, with an address, and its Ready condition True."""
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    if not status.get("podIP"):
        return False
    conditions = status.get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def ready_pod_urls(
    pods: Iterable[Mapping[str, Any]], selector: Mapping[str, str] | None, port: int
) -> list[str]:
    """The URLs of the Ready pods a Service's selector picks, at `port`."""
    urls = set()
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if selects(selector, labels) and pod_is_ready(pod):
            address = str(pod["status"]["podIP"])
            host = f"[{address}]" if ":" in address else address
            urls.add(f"http://{host}:{port}")
    return sorted(urls)


def service_selector(service: Mapping[str, Any] | None) -> dict[str, str] | None:
    """A Service's pod selector; None for a missing Service or one without a selector."""
    if service is None:
        return None
    selector = (service.get("spec") or {}).get("selector")
    return {str(k): str(v) for k, v in selector.items()} if selector else None


class _Watcher(ABC):
    """Lists and watches on a thread until stopped; calls `publish(backend, urls)` when the
    replicas of a backend may have changed."""

    what = "watch"

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        backends: Mapping[str, Backend],
        publish: Callable[[Backend, list[str]], None],
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.backends = dict(backends)
        self.publish = publish
        self.stopped = threading.Event()

    @abstractmethod
    def _sync_once(self) -> None:
        """One list, then its watch until it ends (where it asks for an end) or `stopped` is set."""

    def run(self) -> None:
        """List and watch until stopped; the API server unreachable: back off and retry."""
        until_stopped(self._sync_once, self.stopped, self.what)


class EndpointSliceWatcher(_Watcher):
    """Keeps, per Service, its current slices."""

    what = "EndpointSlice watch"

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        backends: Mapping[str, Backend],
        publish: Callable[[Backend, list[str]], None],
    ) -> None:
        super().__init__(kube, namespace, backends, publish)
        self._slices: dict[str, dict[str, Mapping[str, Any]]] = {}

    @property
    def selector(self) -> str:
        return f"{SERVICE_NAME_LABEL} in ({','.join(sorted(self.backends))})"

    def _apply(self, kind: str, item: Mapping[str, Any]) -> str | None:
        """Account for one event; the Service it changed."""
        metadata = item.get("metadata") or {}
        service = (metadata.get("labels") or {}).get(SERVICE_NAME_LABEL)
        if service not in self.backends:
            return None
        slices = self._slices.setdefault(service, {})
        if kind == "DELETED":
            slices.pop(metadata.get("name", ""), None)
        else:
            slices[metadata.get("name", "")] = item
        return str(service)

    def _publish(self, service: str) -> None:
        backend = self.backends[service]
        self.publish(backend, ready_urls(self._slices.get(service, {}).values(), backend.port))

    def _sync_once(self) -> None:
        listed: dict[str, dict[str, Mapping[str, Any]]] = {}
        events = self.kube.list_and_watch(
            "discovery.k8s.io/v1", "EndpointSlice", self.namespace, self.selector
        )
        for kind, item in events:
            if self.stopped.is_set():
                return
            if kind == "LISTED":
                service = (item.get("metadata", {}).get("labels") or {}).get(SERVICE_NAME_LABEL)
                if service in self.backends:
                    listed.setdefault(service, {})[item["metadata"]["name"]] = item
            elif kind == "SYNCED":
                self._slices = listed
                for service in self.backends:
                    self._publish(service)
            else:
                changed = self._apply(kind, item)
                if changed is not None:
                    self._publish(changed)


class PodWatcher(_Watcher):
    """Keeps the pods of the namespace and each backend Service's selector."""

    what = "pod watch"

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        backends: Mapping[str, Backend],
        publish: Callable[[Backend, list[str]], None],
    ) -> None:
        super().__init__(kube, namespace, backends, publish)
        self._pods: dict[str, Mapping[str, Any]] = {}
        self._selectors: dict[str, dict[str, str] | None] = {}
        self._published: dict[str, list[str]] = {}

    def _publish_changed(self, force: bool = False) -> None:
        for service, backend in self.backends.items():
            urls = ready_pod_urls(self._pods.values(), self._selectors.get(service), backend.port)
            if force or self._published.get(service) != urls:
                self._published[service] = urls
                self.publish(backend, urls)

    def _sync_once(self) -> None:
        self._selectors = {
            service: service_selector(self.kube.get("v1", "Service", service, self.namespace))
            for service in self.backends
        }
        listed: dict[str, Mapping[str, Any]] = {}
        # Every pod of the namespace: selectors differ per Service and cannot be joined into
        # one label selector. Listed again each minute, with each Service's selector read again.
        for kind, item in self.kube.list_and_watch("v1", "Pod", self.namespace, "", for_s=60):
            if self.stopped.is_set():
                return
            name = str((item.get("metadata") or {}).get("name", ""))
            if kind == "LISTED":
                listed[name] = item
            elif kind == "SYNCED":
                self._pods = listed
                self._publish_changed(force=True)
            else:
                if kind == "DELETED":
                    self._pods.pop(name, None)
                else:
                    self._pods[name] = item
                self._publish_changed()


def own_namespace(config: RouterConfig) -> str:
    if config.namespace:
        return config.namespace
    if _SERVICE_ACCOUNT_NAMESPACE.exists():
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return "default"


def discovery_for(config: RouterConfig, kube: Kube | None = None) -> Discovery | None:
    """The discovery task for the backends that name a Service; None when all are fixed."""
    backends = {b.service: b for b in config.backends if b.service is not None and not b.urls}
    if not backends:
        return None

    async def discover(router: Router) -> None:
        loop = asyncio.get_running_loop()
        client = kube if kube is not None else await asyncio.to_thread(Kube.from_environment)

        def publish(backend: Backend, urls: list[str]) -> None:
            role: Role = backend.role
            loop.call_soon_threadsafe(router.set_replicas, backend.deployment, role, urls)

        watching = PodWatcher if config.discovery == DiscoveryMode.PODS else EndpointSliceWatcher
        watcher = watching(client, own_namespace(config), backends, publish)
        thread = threading.Thread(target=watcher.run, name=f"{config.discovery}-watch", daemon=True)
        thread.start()
        try:
            await asyncio.Event().wait()
        finally:
            watcher.stopped.set()

    return discover
