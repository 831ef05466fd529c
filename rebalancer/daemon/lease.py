"""Leader election on a coordination.k8s.io/v1 Lease, client-go style, with an honest `holds()`.

A follower takes over only after it has seen the same record unchanged for a whole lease duration of its
own monotonic clock. A leader counts itself leader only until `renew_deadline` after the moment it
*sent* its last successful renewal, so a replica that loses or cannot renew the lease stops counting
itself leader at least `lease_duration - renew_deadline` seconds before another can take over.

Why not `kubernetes.leaderelection`: its state (who leads, since when) is internal, it learns about a
failed renewal only after `renew_deadline` and stamps renewals after the answer instead of before the
request, it can neither be stopped nor release the lease, its Config calls `sys.exit` and forbids
sub-second periods, and its LeaseLock uses the global client configuration. It must not decide what a
leader does: the loop asks `holds()`.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, cast

import structlog
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer.daemon.clock import utcnow
from rebalancer.kubeapi import read_or_none, release_unread

__all__ = ["DEFAULT_LEASE_NAME", "LeaseElector"]

from rebalancer.daemon.names import DEFAULT_LEASE_NAME

log = structlog.get_logger("rebalancer.daemon")


def _micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Leader election on a coordination.k8s.io/v1 Lease, client-go style, with an honest `holds()`.

    `lease_duration > renew_deadline > retry_period > 0` (seconds, floats allowed; the Lease stores the
    duration rounded up to whole seconds). The background thread tries to acquire or renew every
    `retry_period`; `holds(margin)` is True only while less than `renew_deadline - margin` seconds have
    passed since the last successful acquire / renew request was *sent*.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        name: str = DEFAULT_LEASE_NAME,
        namespace: str = "default",
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utcnow,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError("leader election needs lease_duration > renew_deadline > retry_period > 0")
        self._api = client.CoordinationV1Api(api_client)
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._mono = monotonic
        self._wall = wall
        self._on_change = on_change
        self._timeout = max(0.1, min(renew_deadline / 2, 5.0))
        self._lock = threading.Lock()
        self._renewed_at: float | None = None
        self._term: int | None = None
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._leading = False
        self._stop = threading.Event()
        self._first_round = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- state

    def holds(self, margin: float = 0.0) -> bool:
        """Leader now, with at least `margin` seconds left before the renew deadline."""
        return self.lease_left(margin) > 0

    def lease_left(self, margin: float = 0.0) -> float:
        """Seconds this replica still counts itself leader with `margin` to spare (<= 0: not leader):
        `renew_deadline - margin` after its last successful renewal was sent, on the monotonic clock.

        The renew deadline is shorter than the lease duration a follower waits out (from the moment it
        *saw* that renewal, later than it was sent), so a write fenced by this time ends at least
        `lease_duration - renew_deadline + margin` seconds before another replica can lead."""
        with self._lock:
            renewed = self._renewed_at
        if renewed is None:
            return 0.0
        return renewed + self.renew_deadline - margin - self._mono()

    @property
    def term(self) -> int | None:
        """The Lease's `leaseTransitions` this replica wrote when it became leader (None: not leading).
        Each change of holder raises it, as client-go does, so a later leader always has a larger term."""
        with self._lock:
            return self._term if self._renewed_at is not None else None

    def _lose(self) -> None:
        with self._lock:
            self._renewed_at = None

    def _announce(self) -> None:
        leading = self.holds()
        if leading != self._leading:
            self._leading = leading
            if leading:
                log.info("became leader", lease=f"{self.namespace}/{self.name}", identity=self.identity)
            else:
                log.warning("lost leadership", lease=f"{self.namespace}/{self.name}", identity=self.identity)
            if self._on_change is not None:
                self._on_change(leading)

    # ---- one round

    def _get(self) -> dict[str, Any] | None:
        raw = read_or_none(
            lambda: self._api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=self._timeout
            )
        )
        if raw is None:
            return None
        lease = json.loads(raw)
        if not isinstance(lease, dict):
            raise ValueError("the Lease is not a JSON object")
        return lease

    def _spec(self, previous: Mapping[str, Any], now: datetime) -> dict[str, Any]:
        spec = dict(previous)
        holder = spec.get("holderIdentity") or ""
        stamp = _micro_time(now)
        if holder != self.identity:
            # client-go counts every change of holder, a released (empty) one too: terms never repeat.
            spec["acquireTime"] = stamp
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = max(1, math.ceil(self.lease_duration))
        spec["renewTime"] = stamp
        return spec

    def _body(self, spec: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> Any:
        """A Lease as JSON; `meta` (the one read) carries the resourceVersion the write is guarded by."""
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if meta is not None:
            metadata["resourceVersion"] = meta.get("resourceVersion")
            if meta.get("labels"):
                metadata["labels"] = meta["labels"]
            if meta.get("annotations"):
                metadata["annotations"] = meta["annotations"]
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def _replace(self, spec: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        response = cast(
            "urllib3.BaseHTTPResponse",
            self._api.replace_namespaced_lease(
                self.name,
                self.namespace,
                self._body(spec, meta),
                _preload_content=False,
                _request_timeout=self._timeout,
            ),
        )
        release_unread(response)

    def try_acquire_or_renew(self) -> bool:
        """One election round; True when this replica holds the lease afterwards."""
        sent = self._mono()
        try:
            lease = self._get()
            if lease is None:
                spec = {**self._spec({}, self._wall()), "leaseTransitions": 0}
                created = cast(
                    "urllib3.BaseHTTPResponse",
                    self._api.create_namespaced_lease(
                        self.namespace,
                        self._body(spec),
                        _preload_content=False,
                        _request_timeout=self._timeout,
                    ),
                )
                release_unread(created)
            else:
                spec = lease.get("spec") or {}
                holder = spec.get("holderIdentity") or ""
                meta = lease.get("metadata") or {}
                record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
                if record != self._observed:
                    self._observed, self._observed_at = record, self._mono()
                if holder and holder != self.identity:
                    self._lose()
                    duration = max(self.lease_duration, float(spec.get("leaseDurationSeconds") or 0))
                    if self._observed_at + duration > self._mono():
                        return False
                written = self._spec(spec, self._wall())
                self._replace(written, meta)
                spec = written
        except ApiException as exc:
            if exc.status == 409:  # someone else wrote the Lease first: theirs now
                self._lose()
            log.debug("lease round failed", status=exc.status, reason=exc.reason)
            return False
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            log.debug("lease round failed", error=f"{type(exc).__name__}: {exc}")
            return False
        with self._lock:
            self._renewed_at = sent
            self._term = int(spec.get("leaseTransitions") or 0)
        return True

    def release(self) -> bool:
        """Give the lease up (empty holder) so a standby takes over at once; True when it was ours."""
        was_leader = self.holds()
        self._lose()
        if not was_leader:
            return False
        try:
            lease = self._get()
            spec = dict((lease or {}).get("spec") or {})
            if lease is None or spec.get("holderIdentity") != self.identity:
                return False
            spec.update(holderIdentity=None, leaseDurationSeconds=1, renewTime=_micro_time(self._wall()))
            self._replace(spec, lease.get("metadata") or {})
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            log.warning("could not release the lease", error=f"{type(exc).__name__}: {exc}")
            return False
        log.info("released the lease", lease=f"{self.namespace}/{self.name}")
        return True

    # ---- lifecycle

    def start(self) -> LeaseElector:
        self._thread = threading.Thread(target=self._run, name="lease-elector", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception as exc:  # keep electing whatever one round did
                log.error("lease round crashed", error=f"{type(exc).__name__}: {exc}")
            self._first_round.set()
            self._announce()
            # Followers poll with jitter (as client-go does) so standbys do not move in lockstep.
            delay = self.retry_period if self.holds() else self.retry_period * random.uniform(1.0, 1.2)
            self._stop.wait(delay)

    def wait_first_round(self, timeout: float) -> bool:
        """Wait until the first election round is done (so a start-up cycle knows who leads)."""
        return self._first_round.wait(timeout)

    def stop(self, *, release: bool = True) -> None:
        """Stop electing; `release=False` leaves the lease to expire (as a crashed process would)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._timeout * 2 + self.retry_period)
        if release:
            self.release()
        else:
            self._lose()
        self._announce()
