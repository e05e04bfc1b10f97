"""One kind's objects streamed from a thread, as a controller's informer streams them: listed
once, then watched for as long as it runs, each watch resuming where the last ended; listed
again only after an error (the API server unreachable: with backoff), or at once where the
server no longer holds the version to resume from (410 Gone)."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_when_event_set,
    wait_exponential,
)

from inferfleet.kube import Kube

logger = logging.getLogger(__name__)

GONE = 410


def until_stopped(work: Callable[[], None], stopped: threading.Event, what: str) -> None:
    """Run `work` (a list and its watch, for as long as it lasts) again and again until
    `stopped` is set. An error is logged and backed off, 0.5 s doubling up to 30 s (an API
    server unreachable is asked again, slowly); a backoff ends early when `stopped` is set."""
    retrying = Retrying(
        retry=retry_if_exception_type(Exception),
        wait=wait_exponential(multiplier=0.5, max=30),
        stop=stop_when_event_set(stopped),
        sleep=functools.partial(_wait, stopped),
        before_sleep=lambda state: logger.warning(
            "%s failed (%s); retrying", what, state.outcome and state.outcome.exception()
        ),
    )

    def unless_stopped() -> None:
        if not stopped.is_set():  # a backoff ended early: no last run
            work()

    while not stopped.is_set():
        try:
            retrying(unless_stopped)
        except RetryError:  # stopped before backing off
            return


def _wait(stopped: threading.Event, seconds: float) -> None:
    stopped.wait(seconds)


Deliver = Callable[[str, dict[str, Any]], bool]
"""Takes each event (`Kube.list_and_watch`'s); False: stop."""


class Reflector:
    """Streams `kind` (in `namespace`, or in all where None) to `deliver` from a daemon
    thread: `LISTED` each object, then `SYNCED`, then `ADDED`, `MODIFIED`, `DELETED`; after
    a list again, `LISTED`... `SYNCED` again, and the receiver drops what that list lacks.
    `recheck_unserved_s`: for a kind that only an add-on serves (a CRD), how often to ask
    again while the API server does not serve it (meanwhile: a `SYNCED` of nothing); None: a
    kind every API server serves."""

    def __init__(
        self,
        kube: Kube,
        api_version: str,
        kind: str,
        *,
        namespace: str | None,
        label_selector: str,
        field_selector: str | None = None,
        deliver: Deliver,
        recheck_unserved_s: float | None = None,
    ) -> None:
        self.kube = kube
        self.api_version = api_version
        self.kind = kind
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.deliver = deliver
        self.recheck_unserved_s = recheck_unserved_s
        self.stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"watch-{kind.lower()}-{namespace or 'all'}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stops delivering at once; the thread ends at its watch's next event or end."""
        self.stopped.set()

    def _run(self) -> None:
        where = self.namespace or "all namespaces"
        until_stopped(self._list_and_watch, self.stopped, f"watch of {self.kind} in {where}")

    def _list_and_watch(self) -> None:
        recheck_s = self.recheck_unserved_s
        if recheck_s is not None and self.kube.serves(self.api_version, self.kind) is False:
            if self.deliver("SYNCED", {}):
                self.stopped.wait(recheck_s)
            else:
                self.stopped.set()
            return
        events = self.kube.list_and_watch(
            self.api_version,
            self.kind,
            self.namespace,
            self.label_selector,
            field_selector=self.field_selector,
        )
        try:
            for kind, obj in events:
                if self.stopped.is_set() or not self.deliver(kind, obj):
                    self.stopped.set()
                    return
        except ApiException as error:
            if error.status != GONE:
                raise
            logger.info("watch of %s: its version is gone; listing again", self.kind)
