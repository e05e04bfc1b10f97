"""Reading tenants' API keys from their mounted Secrets (one key per file), again as the
kubelet updates them: a rotated key works within `RouterConfig.key_reload_s`, without a
restart. And the engines' own key, which the router presents to them, read once."""

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


def engine_keys(backends: Sequence[Backend]) -> dict[str, str]:
    """Per deployment, the key its engines require, read from its key file once: engines read
    theirs when they start too, so the two stay the same until both restart."""
    keys = {}
    for backend in backends:
        if backend.key_file is None:
            continue
        try:
            key = Path(backend.key_file).read_text().strip()
        except OSError as error:
            raise RouterConfigError(
                f"backend {backend.deployment}: cannot read its engine key: {error}"
            ) from error
        if not key:
            raise RouterConfigError(f"backend {backend.deployment}: its engine key is empty")
        keys[backend.deployment] = key
    return keys


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
