"""What the operator generates into the Secrets it renders without data
(`desired.Outcome.generate`): random, so made here, at creation, and never by a renderer."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from inferfleet.engines.multinode import (
    SSH_KEYS_CLIENT,
    SSH_KEYS_CLIENT_PUBLIC,
    SSH_KEYS_HOST,
    SSH_KEYS_HOST_PUBLIC,
)
from inferfleet.kube import RefusedError
from inferfleet.reconcile.desired import ObjectKey
from inferfleet.render.multinode import GENERATED_DATA_ANNOTATION, SSH_KEYS

logger = logging.getLogger(__name__)


def ssh_keys(comment: str) -> dict[str, str]:
    """A multi-node group's keys: a client key pair (the leader's) and a host key pair (every
    worker's), Ed25519 in OpenSSH's formats."""
    client, host = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()

    def private(key: Ed25519PrivateKey) -> str:
        return key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()).decode()

    def public(key: Ed25519PrivateKey) -> str:
        line = key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
        return f"{line} {comment}\n"

    return {
        SSH_KEYS_CLIENT: private(client),
        SSH_KEYS_CLIENT_PUBLIC: public(client),
        SSH_KEYS_HOST: private(host),
        SSH_KEYS_HOST_PUBLIC: public(host),
    }


def with_generated_data(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`obj` (a Secret rendered without data) with what its annotation says to generate."""
    metadata = obj["metadata"]
    what = (metadata.get("annotations") or {}).get(GENERATED_DATA_ANNOTATION)
    if what != SSH_KEYS:
        raise ValueError(f"{metadata.get('name')}: nothing known to generate for {what!r}")
    comment = f"{metadata.get('namespace', '')}/{metadata['name']}"
    return {**obj, "stringData": ssh_keys(comment)}


RECREATE_CHECK_S: Final = 600.0
"""How often a Secret created (or found) is created again if it is gone: the operator does not
read or watch Secrets, so one deleted by hand comes back at its owner's first reconcile after
this long."""


class GeneratedSecrets:
    """The Secrets with generated data this process has created or found, by namespace, name
    and owner uid, and when: each is created once, then again only after `RECREATE_CHECK_S`
    (a create that finds it is one request, answered 409). Entries older than that are
    dropped, so deleted owners leave nothing behind. Thread-safe: reconcile workers are
    threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()

    def ensure(self, obj: Mapping[str, Any], create: Callable[[dict[str, Any]], bool]) -> None:
        """Create `obj` with its generated data (`create`: False when one of its name exists)
        unless this process created or found it within `RECREATE_CHECK_S`."""
        metadata = obj["metadata"]
        owner = str(metadata["ownerReferences"][0]["uid"])
        key = (str(metadata.get("namespace", "")), str(metadata["name"]), owner)
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen < RECREATE_CHECK_S:
                return
        create(with_generated_data(obj))
        with self._lock:
            self._seen = {k: t for k, t in self._seen.items() if now - t < RECREATE_CHECK_S}
            self._seen[key] = now

    def retire(
        self,
        key: ObjectKey,
        namespace: str,
        owner_uid: str,
        delete: Callable[[str, str, str, str | None], None],
    ) -> None:
        """Delete a Secret its owner no longer renders (`Outcome.retire`), unread: the operator
        is granted no read of Secrets, and the name carries the owner's uid. Where the delete
        is not granted (RBAC from before it was), the Secret stays until its owner goes, and
        the reconcile goes on. The next `ensure` of it creates it again."""
        try:
            delete(key.api_version, key.kind, key.name, namespace)
        except RefusedError as error:
            logger.warning("%s left in place: %s", key.describe(), error)
        with self._lock:
            self._seen.pop((namespace, key.name, owner_uid), None)
