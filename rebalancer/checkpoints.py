"""Checkpoint requests (docs/checkpoint-protocol.md): asking a pod to checkpoint before its eviction.

Owns the pod annotation patches of the protocol: `request()` asks each opted-in pod a held plan waits
for (`rebalancer.gpu/eviction-requested-at: <now>`, a merge patch carrying the pod's uid, clearing an
old `checkpoint-done`), once per pod and cycle; `withdraw()` removes both annotations from a pod no plan
wanted, `checkpoint_timeout` or more after its request. Every patch asks the write fence first. A request
the authorizer refuses (403 without causes: the namespace has not applied
deploy/checkpoint-rbac.example.yaml) is returned per namespace, with one `checkpoint-request` finding
each; an admission policy's refusal (403 with causes) is an error of that pod.

It must not decide which pods wait (the planner's `checkpoint-pending` guard does), read the clock
(`now` is the cycle's) or write anything but those two annotations.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Final, Literal, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rebalancer import rfc3339
from rebalancer.fence import UNFENCED, Fence, FenceLost, RequestTimeout, clip_timeout
from rebalancer.guards import (
    CHECKPOINT_ANNOTATION,
    CHECKPOINT_DONE_ANNOTATION,
    EVICTION_REQUESTED_AT_ANNOTATION,
    checkpoint_grant,
)
from rebalancer.kubeapi import (
    Backoff,
    describe_answer,
    is_transient,
    release_unread,
    status_body,
    status_message,
    with_retries,
)
from rebalancer.model import NOT_ATTEMPTED, Decision, Finding, Pod, Snapshot
from rebalancer.policy import EvictionConfig
from rebalancer.wording import plural

__all__ = ["CHECKPOINT_REQUEST", "CheckpointRequester"]

# Finding kind.
CHECKPOINT_REQUEST: Final = "checkpoint-request"

_MERGE_PATCH = "application/merge-patch+json"
_PatchProblem = Literal["gone", "forbidden", "error"]

log = logging.getLogger("rebalancer.actuator")


class CheckpointRequester:
    """Writes the checkpoint protocol's annotations on pods, fenced, retried by the one retry rule."""

    def __init__(
        self,
        api_client: client.ApiClient,
        cfg: EvictionConfig,
        *,
        fence: Fence = UNFENCED,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
        request_timeout: RequestTimeout = (5.0, 30.0),
    ) -> None:
        self._core = client.CoreV1Api(api_client)
        self._cfg = cfg
        self._fence = fence
        self._backoff = backoff
        self._sleep = sleep
        self._timeout = request_timeout

    def request(
        self, waiting: Sequence[Decision], now: datetime
    ) -> tuple[tuple[Finding, ...], dict[str, datetime]]:
        """Ask each opted-in pod of the `waiting` plans not asked yet, once; the findings, and the
        namespaces whose requests the authorizer refused (with `now`)."""
        notes: list[Finding] = []
        asked: set[tuple[str, str]] = set()
        refused: dict[str, list[tuple[Pod, str]]] = {}
        for decision in waiting:
            for pod in decision.proposal.pods:
                annotations = pod.annotations
                if (
                    pod.key in asked
                    or annotations.get(CHECKPOINT_ANNOTATION) != "true"
                    or rfc3339.parse_or_none(annotations.get(EVICTION_REQUESTED_AT_ANNOTATION)) is not None
                ):
                    continue
                asked.add(pod.key)
                problem = self._patch_annotations(
                    pod,
                    {
                        EVICTION_REQUESTED_AT_ANNOTATION: rfc3339.format_utc(now),
                        CHECKPOINT_DONE_ANNOTATION: None,
                    },
                )
                if problem is None:
                    log.info("checkpoint requested from %s", pod.ref)
                    continue
                if problem[0] == "gone":  # deleted or re-created since the snapshot: nothing to ask
                    log.info("no checkpoint request for %s: %s", pod.ref, problem[1])
                    continue
                if problem[0] == "forbidden":  # the namespace has not granted the Role: noted per namespace
                    refused.setdefault(pod.namespace, []).append((pod, problem[1]))
                    continue
                detail = (
                    f"cannot ask {pod.ref} to checkpoint ({problem[0]}: {problem[1]}); asked again next cycle"
                )
                notes.append(Finding.about(CHECKPOINT_REQUEST, pod, detail))
        for namespace, pods in sorted(refused.items()):
            log.warning("cannot ask pods of namespace %s to checkpoint: %s", namespace, pods[0][1])
            refs = [p.ref for p, _ in pods]
            shown = ", ".join(refs[:3]) + (f" and {len(refs) - 3} more" if len(refs) > 3 else "")
            notes.append(
                Finding(
                    kind=CHECKPOINT_REQUEST,
                    namespace=namespace,
                    detail=(
                        f"namespace {namespace} has not granted checkpoint requests ({pods[0][1]}); its pods "
                        f"that ask to checkpoint before eviction are held, never evicted unasked "
                        f"({plural(len(refs), 'pod')}: {shown}); grant it with {checkpoint_grant(namespace)}"
                    ),
                )
            )
        return tuple(notes), dict.fromkeys(refused, now)

    def withdraw(self, snapshot: Snapshot, wanted: set[tuple[str, str]]) -> None:
        """Withdraw every request no plan of this cycle wanted, `checkpoint_timeout` or more after it."""
        timeout = timedelta(seconds=self._cfg.checkpoint_timeout)
        for pod in snapshot.pods:
            if EVICTION_REQUESTED_AT_ANNOTATION not in pod.annotations or pod.key in wanted:
                continue
            asked = rfc3339.parse_or_none(pod.annotations[EVICTION_REQUESTED_AT_ANNOTATION])
            if asked is not None and snapshot.now - asked < timeout:
                continue  # still inside its window: a plan may want the pod again next cycle
            problem = self._patch_annotations(
                pod, {EVICTION_REQUESTED_AT_ANNOTATION: None, CHECKPOINT_DONE_ANNOTATION: None}
            )
            if problem is None:
                log.info("checkpoint request of %s withdrawn: no plan wants it evicted any more", pod.ref)
            elif problem[0] != "gone":
                log.warning("cannot withdraw the checkpoint request of %s: %s", pod.ref, problem[1])

    def _patch_annotations(
        self, pod: Pod, annotations: Mapping[str, str | None]
    ) -> tuple[_PatchProblem, str] | None:
        """Merge-patch the pod's annotations (None removes one). The patch carries the pod's uid: the API
        server refuses to change it (409 / 422 naming the uid), so a re-created pod of the same name is never
        annotated. None when done, else (`gone` | `forbidden` (403: no Role in the pod's namespace grants
        it) | `error`, why)."""
        if not pod.uid:
            return ("error", "pod has no uid: refusing to patch without a uid precondition")
        body = {"metadata": {"uid": pod.uid, "annotations": dict(annotations)}}

        def attempt() -> None:
            timeout = clip_timeout(self._timeout, self._fence.check())
            response = cast(
                "urllib3.BaseHTTPResponse",
                self._core.patch_namespaced_pod(
                    pod.name,
                    pod.namespace,
                    body,
                    _content_type=_MERGE_PATCH,
                    _preload_content=False,
                    _request_timeout=timeout,
                ),
            )
            release_unread(response)

        try:
            with_retries(attempt, retries=self._cfg.retries, backoff=self._backoff, sleep=self._sleep)
        except FenceLost as lost:
            return ("error", f"{NOT_ATTEMPTED}{lost.reason}")
        except ApiException as exc:
            status = exc.status or 0
            if status == 404:
                return ("gone", "pod no longer exists (404)")
            if status == 409 or (status == 422 and "uid" in status_message(exc)):
                return ("gone", f"pod was replaced or changed ({status})")
            if status == 403 and not (status_body(exc).get("details") or {}).get("causes"):
                # The authorizer's refusal: no role grants it. An admission policy's denial (also 403
                # when its reason is Forbidden) carries its message as a cause, and is an error.
                return ("forbidden", describe_answer(exc))
            if not is_transient(exc):
                return ("error", describe_answer(exc))
            return ("error", f"{describe_answer(exc)} (after {self._cfg.retries + 1} attempts)")
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return ("error", f"{describe_answer(exc)} (after {self._cfg.retries + 1} attempts)")
        return None
