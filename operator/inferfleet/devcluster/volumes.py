"""PersistentVolumes for the dev cluster: a provisioner of directories of this machine, as a
cluster's local-path provisioner makes them, so that a PersistentVolumeClaim binds and the
fleet agent's processes read and write its files.

The dev cluster's StorageClass (`STORAGE_CLASS`, the cluster's default) names this
provisioner. For each claim of that class left Pending, the provisioner makes a `hostPath`
PersistentVolume bound to it (its `claimRef`) at `<state dir>/volumes/<namespace>_<claim>_<uid>`
with the claim's size and access modes; the controller manager's volume binder completes the
binding, as it does for any provisioner's volumes. A volume whose claim is deleted
(`Released`) is deleted with its directory, as the class's `Delete` reclaim policy says.
Sizes are recorded, not enforced; every access mode is honoured, since every node is this
machine.

The pure parts (`storage_class`, `volume_for`, `claim_directory`) decide; `Provisioner` runs
them against the API server, with the fleet agent."""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from inferfleet.kube import Kube
from inferfleet.kube.reflector import until_stopped

log = logging.getLogger(__name__)

STORAGE_CLASS: Final = "inferfleet-dev-local"
PROVISIONER: Final = "inferfleet.io/dev-local-path"
DEFAULT_CLASS_ANNOTATION: Final = "storageclass.kubernetes.io/is-default-class"


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def volume_name(claim: Mapping[str, Any]) -> str:
    return f"pvc-{claim['metadata']['uid']}"


def claim_directory(root: Path, claim: Mapping[str, Any]) -> Path:
    metadata = claim["metadata"]
    return root / f"{metadata['namespace']}_{metadata['name']}_{metadata['uid']}"


def wants_volume(claim: Mapping[str, Any]) -> bool:
    """A claim of this class that no volume is bound to yet."""
    spec, status = claim.get("spec") or {}, claim.get("status") or {}
    return (
        spec.get("storageClassName") == STORAGE_CLASS
        and not spec.get("volumeName")
        and status.get("phase", "Pending") == "Pending"
        and not (claim.get("metadata") or {}).get("deletionTimestamp")
    )


def volume_for(claim: Mapping[str, Any], directory: Path) -> dict[str, Any]:
    """The PersistentVolume that serves `claim` from `directory`, bound to it."""
    metadata, spec = claim["metadata"], claim.get("spec") or {}
    size = (spec.get("resources") or {}).get("requests", {}).get("storage", "1Gi")
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": volume_name(claim),
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": size},
            "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": STORAGE_CLASS,
            "volumeMode": spec.get("volumeMode") or "Filesystem",
            "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": metadata["namespace"],
                "name": metadata["name"],
                "uid": metadata["uid"],
            },
        },
    }  # fmt: skip


def released(volume: Mapping[str, Any]) -> bool:
    """One of this provisioner's volumes whose claim is gone."""
    annotations = (volume.get("metadata") or {}).get("annotations") or {}
    return annotations.get("pv.kubernetes.io/provisioned-by") == PROVISIONER and (
        volume.get("status") or {}
    ).get("phase") in ("Released", "Failed")


class Provisioner:
    """Watches claims and volumes: makes a volume for each claim of the class, deletes those
    released. Runs on a thread of the fleet agent until `stopped` is set."""

    def __init__(self, kube: Kube, root: Path, stopped: threading.Event) -> None:
        self.kube = kube
        self.root = root
        self.stopped = stopped
        self._class_applied = False

    def run(self) -> None:
        until_stopped(self._sync_once, self.stopped, "volume provisioning")

    def _sync_once(self) -> None:
        if not self._class_applied:
            self.kube.apply(storage_class())
            self._class_applied = True
        for volume in self.kube.list("v1", "PersistentVolume"):
            if released(volume):
                self._delete(volume)
        for kind, claim in self.kube.list_and_watch(
            "v1", "PersistentVolumeClaim", None, "", for_s=15
        ):
            if self.stopped.is_set():
                return
            if kind in ("LISTED", "ADDED", "MODIFIED") and wants_volume(claim):
                self._provision(claim)

    def _provision(self, claim: Mapping[str, Any]) -> None:
        directory = claim_directory(self.root, claim)
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o777)  # any pod's user writes, as an fsGroup-less local volume allows
        if self.kube.create(volume_for(claim, directory)):
            where = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
            log.info("provisioned %s for %s at %s", volume_name(claim), where, directory)

    def _delete(self, volume: Mapping[str, Any]) -> None:
        name = str(volume["metadata"]["name"])
        path = ((volume.get("spec") or {}).get("hostPath") or {}).get("path")
        self.kube.delete("v1", "PersistentVolume", name, None)
        if path and Path(path).is_relative_to(self.root):
            shutil.rmtree(path, ignore_errors=True)
        log.info("deleted %s (its claim is gone)", name)
