"""Reading tenants' API keys from their mounted Secrets (one key per file), again as the
kubelet updates them: a rotated key works within `RouterConfig.key_reload_s`, without a
restart. And the engines' own key, which the router presents to them, read the same way:
the key before the last change is kept, because engines read theirs only when they start and
those started before a rotation still want it (`EngineKeys`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from inferfleet.router.config import Backend, RouterConfigError
from inferfleet.router.tenants import Tenants

log = logging.getLogger(__name__)


def read_keys(directory: str) -> list[str]:
    """Each regular file's content, stripped (names starting with a dot are the kubelet's own:
    `..data` and the timestamped directory it points to)."""
    found = []
    for path in sorted(Path(directory).iterdir()):
        if not path.name.startswith(".") and path.is_file():
            found.append(path.read_text().strip())
    return [key for key in found if key]


def _read_engine_key(backend: Backend) -> str:
    try:
        key = Path(str(backend.key_file)).read_text().strip()
    except (OSError, ValueError) as error:  # ValueError: not UTF-8
        raise RouterConfigError(
            f"backend {backend.deployment}: cannot read its engine key: {error}"
        ) from error
    if not key:
        raise RouterConfigError(f"backend {backend.deployment}: its engine key is empty")
    if not key.isprintable() or any(c.isspace() for c in key):
        # A header value cannot carry it: every call would fail.
        raise RouterConfigError(
            f"backend {backend.deployment}: its engine key holds spaces or control characters"
        )
    return key


def engine_keys(backends: Sequence[Backend]) -> dict[str, str]:
    """Per deployment, the key its engines require, as its key file holds it now."""
    return {b.deployment: _read_engine_key(b) for b in backends if b.key_file is not None}


class EngineKeys:
    """Per deployment, the keys to present to its engines, the newest first: the key file's
    content, and the one it held before its last change. A rotation (the Secret's key
    replaced) takes no restart of the router: engines started since take the new key, those
    started before still take the previous one until they are restarted (`kubectl rollout
    restart`), and a call the first key gets refused (401) is made again with the second. A
    router started after the change knows only the new key."""

    def __init__(self, backends: Sequence[Backend]) -> None:
        self._backends = [b for b in backends if b.key_file is not None]
        self._keys: dict[str, tuple[str, ...]] = {
            deployment: (key,) for deployment, key in engine_keys(self._backends).items()
        }

    @property
    def any(self) -> bool:
        return bool(self._backends)

    def keys(self, deployment: str) -> tuple[str, ...]:
        """The keys to try, in order; () where the deployment's engines take none."""
        return self._keys.get(deployment, ())

    def load(self) -> None:
        """Read every key file again; a file that cannot be read, or is empty, leaves the keys
        as they were (logged)."""
        for backend in self._backends:
            try:
                key = _read_engine_key(backend)
            except RouterConfigError as error:
                log.warning("%s; presenting the keys read before", error)
                continue
            held = self._keys.get(backend.deployment, ())
            if not held or held[0] != key:
                self._keys[backend.deployment] = (key, *held[:1])
                log.info(
                    "backend %s: its engine key changed; the key before is presented to engines "
                    "that refuse the new one (upstream errors of kind key count them)",
                    backend.deployment,
                )


async def reload_engine_keys(keys: EngineKeys, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        await asyncio.to_thread(keys.load)


def load_keys(tenants: Tenants) -> None:
    """Every tenant's keys as their files hold them now; a tenant whose directory cannot be
    read keeps the keys it had (logged)."""
    for spec in tenants.specs:
        try:
            keys = read_keys(spec.keys)
        except OSError as error:
            log.warning("tenant %s: cannot read its keys in %s: %s", spec.name, spec.keys, error)
            continue
        tenants.keys.replace(spec.name, keys)


async def reload_keys(tenants: Tenants, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        await asyncio.to_thread(load_keys, tenants)
