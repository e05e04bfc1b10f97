"""A coordination.k8s.io/v1 Lease through the official client: what leader election
(`reconcile.leadership`) reads and writes, with optimistic concurrency on resourceVersion."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException


@dataclass(frozen=True)
class LeaseRecord:
    """The election fields of a Lease's spec. `holder` is empty when the lease is released."""

    holder: str
    lease_duration_s: int
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0


logger = logging.getLogger(__name__)


class LeaseConflictError(Exception):
    """Another writer changed (or created) the Lease since it was read."""


def micro_time(moment: datetime) -> datetime:
    """`moment` as the client sends a MicroTime well: the client writes `isoformat()`, which
    drops the fraction when it is zero, and the API server wants exactly six digits (one
    microsecond later is the same instant to any lease)."""
    moment = moment.astimezone(UTC)
    return moment if moment.microsecond else moment.replace(microsecond=1)


def lease_spec(record: LeaseRecord) -> client.V1LeaseSpec:
    return client.V1LeaseSpec(
        holder_identity=record.holder or None,
        lease_duration_seconds=record.lease_duration_s,
        acquire_time=None if record.acquire_time is None else micro_time(record.acquire_time),
        renew_time=None if record.renew_time is None else micro_time(record.renew_time),
        lease_transitions=record.transitions,
    )


def _resource_version(lease: client.V1Lease) -> str:
    if lease.metadata is None or lease.metadata.resource_version is None:
        raise LeaseConflictError("the API server answered a Lease without a resourceVersion")
    return lease.metadata.resource_version


class KubernetesLeaseStore:
    """The Lease through the official client's CoordinationV1Api."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        name: str,
        owner_deployment: str | None = None,
    ) -> None:
        self._api = client.CoordinationV1Api(api_client)
        self._apps = client.AppsV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self.owner_deployment = owner_deployment
        """The operator's Deployment (in the Lease's namespace): the Lease's owner, so that the
        garbage collector removes the Lease with the operator (`helm uninstall`)."""
        self._owner: client.V1OwnerReference | None = None
        self._owner_looked_up = False

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    def _owner_reference(self, timeout_s: float) -> client.V1OwnerReference | None:
        """The owner Deployment's reference, looked up once. One that cannot be read (RBAC of
        an earlier release, a Deployment of another name) leaves the Lease without an owner,
        said once in the log: leader election never waits on it."""
        if self._owner_looked_up or not self.owner_deployment:
            return self._owner
        self._owner_looked_up = True
        try:
            deployment = self._apps.read_namespaced_deployment(
                self.owner_deployment, self.namespace, _request_timeout=timeout_s
            )
        except (ApiException, urllib3.exceptions.HTTPError) as error:
            logger.warning(
                "leader election: the Lease gets no owner (Deployment %s/%s: %s); remove it by "
                "hand if the operator is removed",
                self.namespace,
                self.owner_deployment,
                getattr(error, "reason", error),
            )
            return None
        uid = deployment.metadata.uid if deployment.metadata is not None else None
        if uid:
            self._owner = client.V1OwnerReference(
                api_version="apps/v1", kind="Deployment", name=self.owner_deployment, uid=uid
            )
        return self._owner

    def _body(
        self, record: LeaseRecord, resource_version: str | None, timeout_s: float
    ) -> client.V1Lease:
        owner = self._owner_reference(timeout_s)
        return client.V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=client.V1ObjectMeta(
                name=self.name,
                namespace=self.namespace,
                resource_version=resource_version,
                owner_references=[owner] if owner is not None else None,
            ),
            spec=lease_spec(record),
        )

    def read(self, timeout_s: float) -> tuple[LeaseRecord, str] | None:
        try:
            lease = self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=timeout_s
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        spec = lease.spec or client.V1LeaseSpec()
        record = LeaseRecord(
            holder=spec.holder_identity or "",
            lease_duration_s=int(spec.lease_duration_seconds or 0),
            acquire_time=spec.acquire_time,
            renew_time=spec.renew_time,
            transitions=int(spec.lease_transitions or 0),
        )
        return record, _resource_version(lease)

    def create(self, record: LeaseRecord, timeout_s: float) -> str:
        try:
            created = self._api.create_namespaced_lease(
                self.namespace, self._body(record, None, timeout_s), _request_timeout=timeout_s
            )
        except ApiException as error:
            if error.status == 409:
                raise LeaseConflictError("created by another candidate first") from None
            raise
        return _resource_version(created)

    def replace(self, record: LeaseRecord, resource_version: str, timeout_s: float) -> str:
        try:
            replaced = self._api.replace_namespaced_lease(
                self.name,
                self.namespace,
                self._body(record, resource_version, timeout_s),
                _request_timeout=timeout_s,
            )
        except ApiException as error:
            if error.status == 409:
                raise LeaseConflictError("changed since it was read") from None
            raise
        return _resource_version(replaced)


TRANSIENT_ERRORS = (ApiException, LeaseConflictError, urllib3.exceptions.HTTPError, OSError)
"""Failures of one attempt: refused, unreachable, timed out. The election tries again."""
