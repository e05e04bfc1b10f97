"""Published CRDs of the Kubernetes projects the operator renders objects for, installed in the
dev cluster so that its real API server validates every object the operator renders. Only
the CRDs: their controllers are not served to these machines and do not run here, so a test
that needs an object's status sets it itself, and says so.

LeaderWorkerSet: `leaderworkerset.x-k8s.io_leaderworkersets.yaml` is kubernetes-sigs/lws at tag
v0.10.0 (commit 2161f38ff333f9e24d3c44adef7cd5d9787cac00), `config/crd/bases/`, unmodified
(Apache License 2.0): the file without the conversion webhook that the release's
`manifests.yaml` and chart add, which would need LWS's controller to answer it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

_HERE = Path(__file__).parent


@dataclass(frozen=True)
class PublishedCrd:
    project: str
    release: str
    file: str
    sha256: str
    """Of the file as published: a test checks the copy here is that file."""

    @property
    def path(self) -> Path:
        return _HERE / self.file


LEADER_WORKER_SET = PublishedCrd(
    project="kubernetes-sigs/lws",
    release="v0.10.0",
    file="leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    sha256="c5dcad8ed943e495490241f00b9a1b45d51203b6d484020db3636d5bf553568e",
)
PUBLISHED_CRDS = (LEADER_WORKER_SET,)


def file_sha256(crd: PublishedCrd) -> str:
    return hashlib.sha256(crd.path.read_bytes()).hexdigest()


@cache
def published_crd(crd: PublishedCrd) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load(crd.path.read_text(), Loader=yaml.CSafeLoader)
    return loaded
