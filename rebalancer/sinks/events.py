"""Kubernetes Events for what the rebalancer did, so `kubectl describe pod` / `describe node` explains it.

Owns turning a live CycleReport into core/v1 Events: one `Normal` Event per row whose outcome is
`evicted`, on the pod (involvedObject kind Pod, namespace, name and the uid the report row carries, which
`kubectl describe` matches on), with reason `GpuRebalancer<Strategy>` (the strategy's name
in CamelCase: `GpuRebalancerGpuConsolidation`) and the decision's reason as message (redacted:
`redaction.redact`, before it is clipped to 1024 characters); and one per node the
report says was freed (`freed_nodes`), in namespace `default` with the node's name as uid, as the
kubelet's node Events are; and one per workload whose own object a workload action wrote (`notices`:
the owner told, its GPUs reclaimed, its idle mark lifted), on that object with its uid, the owner's
message (with the command to snooze) as text.

Requests are bounded: at most `max_events` per report, one attempt each (no retries), short timeouts, and
the first server-side or transport failure (5xx, throttling, timeout, refused connection) stops the rest.
An Event that already exists (409) counts as posted. Any failure is raised as `EventsSinkError` after the
attempt, for the caller to log (run_cycle hands sink errors to `on_sink_error`): a sink never fails a
cycle.

It must not post anything for a dry run or for rows that were not evicted or written (`would-evict`,
refused, blocked, `checkpoint-pending`, errors), read the clock (Event times are the report's `now`),
or change any object but Events.
"""

from __future__ import annotations

import logging
import re
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer.cycle_report import CycleReport, ReportedDecision, WorkloadNotice
from rebalancer.fence import RequestTimeout
from rebalancer.kubeapi import describe_transport_error
from rebalancer.model import OutcomeResult
from rebalancer.redaction import redact
from rebalancer.workloads import KINDS

__all__ = ["EVENT_PREFIX", "EventsSinkError", "KubeEventsSink", "event_reason"]

EVENT_PREFIX = "GpuRebalancer"
NODE_EVENT_NAMESPACE = "default"
# A workload's own object was written (a bare pod's reclaim is an eviction, with its pod's Event).
_WORKLOAD_WRITES: frozenset[OutcomeResult] = frozenset(
    {"notified", "scaled", "suspended", "stopped", "cleared"}
)
IDLE_GPU = "idle-gpu"
# Event messages are for people; the API server also caps them.
MAX_MESSAGE_CHARS = 1024

log = logging.getLogger(__name__)


class EventsSinkError(Exception):
    """Some Events of a report could not be created; the message says how many and the first reason."""


def event_reason(strategy: str) -> str:
    """`gpu-consolidation` -> `GpuRebalancerGpuConsolidation`."""
    return EVENT_PREFIX + "".join(
        part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", strategy)
    )


@dataclass(frozen=True, slots=True)
class _Event:
    namespace: str
    involved: client.V1ObjectReference
    reason: str
    message: str
    action: str
    component: str
    instance: str

    @property
    def name(self) -> str:
        return str(self.involved.name)

    def build(self, name: str, now: datetime) -> client.CoreV1Event:
        stamp = now.astimezone(UTC).replace(microsecond=0)
        return client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=name, namespace=self.namespace),
            involved_object=self.involved,
            reason=self.reason,
            message=self.message[:MAX_MESSAGE_CHARS],
            type="Normal",
            action=self.action,
            source=client.V1EventSource(component=self.component),
            reporting_component=self.component,
            reporting_instance=self.instance,
            first_timestamp=stamp,
            last_timestamp=stamp,
            count=1,
        )


class KubeEventsSink:
    """Publishes Events for a live report; pod Events carry the uid the report row gives."""

    def __init__(
        self,
        api_client: client.ApiClient,
        component: str = "gpu-rebalancer",
        *,
        instance: str | None = None,
        max_events: int = 100,
        request_timeout: RequestTimeout = (3.0, 10.0),
    ) -> None:
        if max_events < 1:
            raise ValueError("max_events must be at least 1")
        self._core = client.CoreV1Api(api_client)
        self.component = component
        self._instance = instance or component
        self._max = max_events
        self._timeout = request_timeout

    def publish(self, report: CycleReport) -> None:
        if report.mode != "live":
            return
        evicted = [row for row in report.decisions if row.outcome == "evicted"]
        events = [self._pod_event(row) for row in evicted]
        for node in report.freed_nodes:
            row = next((r for r in evicted if r.node == node), None)
            if row is not None:
                events.append(self._node_event(node, row))
        events += [self._workload_event(n) for n in report.notices if n.result in _WORKLOAD_WRITES]
        if len(events) > self._max:
            log.warning("%d Events to post, posting the first %d", len(events), self._max)
        events = events[: self._max]
        stamp = int(report.now.timestamp() * 1_000_000_000)
        failures: list[str] = []
        posted = 0
        for index, event in enumerate(events):
            problem, fatal = self._create(
                event.namespace, event.build(f"{event.name}.{stamp + index:x}", report.now)
            )
            if problem is None:
                posted += 1
                continue
            failures.append(problem)
            if fatal:
                break
        if failures:
            raise EventsSinkError(
                f"{len(events) - posted} of {len(events)} Events not created: {failures[0]}"
            )

    # ---- building

    def _pod_event(self, row: ReportedDecision) -> _Event:
        return _Event(
            namespace=row.namespace,
            involved=client.V1ObjectReference(
                api_version="v1",
                kind="Pod",
                namespace=row.namespace,
                name=row.pod,
                uid=row.uid or None,
            ),
            reason=event_reason(row.strategy),
            message=redact(row.reason),
            action="Evict",
            component=self.component,
            instance=self._instance,
        )

    def _node_event(self, node: str, row: ReportedDecision) -> _Event:
        return _Event(
            namespace=NODE_EVENT_NAMESPACE,
            involved=client.V1ObjectReference(api_version="v1", kind="Node", name=node, uid=node),
            reason=event_reason(row.strategy),
            message=f"node drained by {self.component}: {redact(row.reason)}",
            action="Drain",
            component=self.component,
            instance=self._instance,
        )

    def _workload_event(self, notice: WorkloadNotice) -> _Event:
        namespace, kind_name, name = notice.workload
        kind = KINDS[kind_name]
        return _Event(
            namespace=namespace,
            involved=client.V1ObjectReference(
                api_version=kind.api_version,
                kind=kind_name,
                namespace=namespace,
                name=name,
                uid=notice.uid or None,
            ),
            reason=event_reason(IDLE_GPU),
            message=redact(notice.text),
            action=notice.verb.capitalize(),
            component=self.component,
            instance=self._instance,
        )

    # ---- posting

    def _create(self, namespace: str, event: client.CoreV1Event) -> tuple[str | None, bool]:
        """(None, _) when created; else (why, whether to stop posting)."""
        what = f"Event on {event.involved_object.kind} {event.involved_object.name}"
        try:
            response = cast(
                "urllib3.BaseHTTPResponse",
                self._core.create_namespaced_event(
                    namespace, event, _preload_content=False, _request_timeout=self._timeout
                ),
            )
            with suppress(urllib3.exceptions.HTTPError, OSError):
                response.drain_conn()
            response.release_conn()
            return None, False
        except ApiException as exc:
            status = exc.status or 0
            if status == 409:  # already posted (a report published twice)
                return None, False
            fatal = status in (0, 429) or status >= 500
            return f"{what}: HTTP {status} {exc.reason or ''}".rstrip(), fatal
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return f"{what}: {describe_transport_error(exc)}", True
