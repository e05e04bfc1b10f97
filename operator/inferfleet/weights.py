"""The weight cache's two commands (`render.weight_cache`), run from the install's image:

- `fill`: lists the source's files at its current commit, downloads into the volume those a
  replica reads (`files_to_fill`), and writes the marker last. It resumes: `huggingface_hub`
  skips a file already whole in the directory and continues a partial one, so a restarted
  pod fetches only what is missing. Progress (bytes of whole files, the commit) is pushed to
  the deployment's progress ConfigMap every `PUSH_EVERY_S` and at the end; a push that fails
  is logged and the fill goes on (the Job's end is what the operator trusts).
- `wait`: holds a replica until the marker is in the weights' directory.

The Hugging Face client is imported here alone, when a command runs: never on the
operator's import path.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from inferfleet.kube import Kube
from inferfleet.render.weight_cache import FILLED_MARKER, FillReport, hub_repository, push_body

log = logging.getLogger(__name__)

PUSH_EVERY_S: Final = 5.0
WAIT_POLL_S: Final = 2.0
WAIT_LOG_EVERY_S: Final = 60.0
DOWNLOAD_WORKERS: Final = 4

NOT_SERVED: Final = (
    "original/*", "*.pth", "*.pt", "*.gguf", "*.onnx", "*.h5", "*.msgpack", "*.ot", "*.tflite",
)  # fmt: skip
"""Files a hub repository may hold beside the checkpoint an engine reads: another framework's
copy of the weights (a Llama repository's `original/` doubles its size)."""
SAFETENSORS: Final = "*.safetensors"


def files_to_fill(names: Sequence[str]) -> list[str]:
    """The files of a repository a replica reads: all but other frameworks' copies of the
    weights, and the PyTorch `.bin` weights where safetensors are there (engines prefer
    them, as vLLM's own download does)."""
    skipped = list(NOT_SERVED)
    if any(fnmatch.fnmatch(name, SAFETENSORS) for name in names):
        skipped.append("*.bin")
    return sorted(n for n in names if not any(fnmatch.fnmatch(n, p) for p in skipped))


@dataclass(frozen=True)
class Listed:
    name: str
    size: int
    whole: bool
    """Already in the directory, whole, at this commit."""


Push = Callable[[FillReport], None]


class _Progress:
    """Bytes of whole files, pushed at most every `PUSH_EVERY_S` (and always at the end)."""

    def __init__(self, job: str, revision: str, total: int, filled: int, push: Push | None):
        self._lock = threading.Lock()
        self._report = FillReport(job, total, filled, revision)
        self._push = push
        self._pushed_at = float("-inf")

    def add(self, size: int, *, final: bool = False) -> None:
        with self._lock:
            report = self._report
            self._report = FillReport(
                report.job, report.bytes_total, report.bytes_filled + size, report.revision
            )
            due = final or time.monotonic() - self._pushed_at >= PUSH_EVERY_S
            if due:
                self._pushed_at = time.monotonic()
                self._send(self._report)

    @property
    def report(self) -> FillReport:
        return self._report

    def _send(self, report: FillReport) -> None:
        if self._push is None:
            return
        try:
            self._push(report)
        except Exception as error:  # the fill goes on; its Job's end is what counts
            log.warning("cannot push the fill's progress (%s)", error)


def fill(
    source: str,
    directory: Path,
    *,
    job: str = "",
    push: Push | None = None,
    workers: int = DOWNLOAD_WORKERS,
) -> FillReport:
    """Fill `directory` with the files of `source` (hf://org/repo) a replica reads, at the
    repository's current commit; the marker is written last."""
    from huggingface_hub import hf_hub_download, snapshot_download  # noqa: PLC0415

    repo = hub_repository(source)
    directory.mkdir(parents=True, exist_ok=True)
    listing = snapshot_download(repo, local_dir=directory, dry_run=True)
    revision = listing[0].commit_hash if listing else ""
    keep = set(files_to_fill([f.filename for f in listing]))
    listed = [
        Listed(f.filename, f.file_size or 0, not f.will_download)
        for f in listing
        if f.filename in keep
    ]
    total = sum(f.size for f in listed)
    progress = _Progress(job, revision, total, sum(f.size for f in listed if f.whole), push)
    progress.add(0, final=True)
    missing = [f for f in listed if not f.whole]
    log.info(
        "filling %s from %s at %s: %d files, %d to fetch (%.2f of %.2f GB)",
        directory, repo, revision, len(listed), len(missing),
        sum(f.size for f in missing) / 1e9, total / 1e9,
    )  # fmt: skip
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        fetches = {
            pool.submit(
                hf_hub_download, repo, f.name, revision=revision or None, local_dir=directory
            ): f
            for f in missing
        }
        for done in as_completed(fetches):
            done.result()
            progress.add(fetches[done].size)
    marker = {
        "source": source,
        "revision": revision,
        "bytes": total,
        "files": sorted(f.name for f in listed),
        "filledAt": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    staged = directory / f"{FILLED_MARKER}.partial"
    staged.write_text(json.dumps(marker, indent=2))
    staged.replace(directory / FILLED_MARKER)
    progress.add(0, final=True)
    log.info("filled %s: %.2f GB at %s", directory, total / 1e9, revision)
    return progress.report


def wait(
    directory: Path, *, poll_s: float = WAIT_POLL_S, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Return once the fill's marker is in `directory`."""
    marker = directory / FILLED_MARKER
    logged = float("-inf")
    while not marker.exists():
        if time.monotonic() - logged >= WAIT_LOG_EVERY_S:
            log.info("waiting for the weight cache's fill (%s)", marker)
            logged = time.monotonic()
        sleep(poll_s)
    log.info("the weights are on the volume: %s", marker.read_text().strip()[:200])


def config_map_push(name: str, namespace: str | None = None) -> Push:
    """Pushes a report to the ConfigMap `name` of the pod's namespace, by merge patch."""
    client = Kube.from_environment()
    where = namespace or os.environ.get("POD_NAMESPACE") or "default"

    def push(report: FillReport) -> None:
        client.merge_patch("v1", "ConfigMap", name, where, push_body(report, datetime.now(UTC)))

    return push
