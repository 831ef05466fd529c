"""`idle-gpu`'s workload lifecycle: report, tell the owner, then reclaim, with the state on the workload.

Owns what one idle workload leads to under its `report` / `notify` / `reclaim` rule, read from the
annotations on the workload's own object (`rebalancer.workloads`), so that restarts and leader changes
keep it:

- `report`: one `idle-gpu` finding for the workload: its GPUs, the evidence, the idle GPU-hours so far
  (since `rebalancer.gpu/idle-since`, else at least the window) and their cost.
- `notify`: the finding, and a `notify` proposal while the owner has not been told
  (no readable `idle-since`): the actuator writes `idle-since`, an Event and a message.
- `reclaim`: notify first; once `grace` has passed since `idle-since`, a `reclaim` proposal that frees
  the GPUs the way the kind allows (scale to 0, suspend, stop). `rebalancer.gpu/snooze-until` in the
  future holds both (an unreadable one holds them too, and says so). A bare pod has no object to keep
  the state on (pods are never patched): its reclaim is an eviction, with no notice, and only where
  the policy allows evicting bare pods; notify on a bare pod is a finding.
- A workload still carrying `idle-since` whose pods computed again (usable evidence, not idle) gets a
  `clear` proposal: the grace period starts over the next time it is idle.

A workload whose object the snapshot lacks, or of a kind no reclaim knows, is reported and says why.

This module must stay pure: no I/O, no clock (`snapshot.now`). It applies no guard: the planner does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property

from rebalancer import rfc3339
from rebalancer.gpu_devices import mig_share
from rebalancer.model import (
    MIG_RESOURCE_PREFIX,
    Finding,
    Pod,
    Proposal,
    ReclaimHow,
    Snapshot,
    TelemetryWindow,
    WorkloadAction,
    WorkloadVerb,
)
from rebalancer.policy import format_duration
from rebalancer.registry import StrategyContext
from rebalancer.wording import plural
from rebalancer.workloads import IDLE_SINCE, SNOOZE_UNTIL, Resolved
from strategies.idle_gpu_evidence import NAME, REPORT, IdleAction, IdleGpuArgs, Verdict, fmt, idle_text

# What each way of reclaiming does, for the reports and the owner's message.
RECLAIM_WORDS: Mapping[ReclaimHow, str] = {
    "scale": "scaled to 0 replicas",
    "suspend": "suspended",
    "stop": "stopped",
    "evict": "evicted",
}


def gpu_equivalents(pod: Pod, model: str) -> float:
    """GPUs the pod holds: whole devices and shares as they are, a MIG instance as its share of a GPU of
    `model` (1 when the profile or the model does not say)."""
    held = pod.gpu.gpus
    for resource, count in pod.requests.items():
        if resource.startswith(MIG_RESOURCE_PREFIX) and count > 0:
            held += count * (mig_share(resource.removeprefix(MIG_RESOURCE_PREFIX), model) or 1.0)
    return held


def _time(annotations: Mapping[str, str], key: str) -> tuple[datetime | None, str | None]:
    """The annotation's time, or None; and, when it is there but unreadable, a sentence saying so."""
    text = annotations.get(key)
    if text is None:
        return None, None
    try:
        return rfc3339.parse(text.strip()), None
    except ValueError:
        return None, f'annotation {key}: "{text}" is not an RFC 3339 time'


def _gpus_text(gpus: float) -> str:
    return f"{fmt(gpus)} GPU" if gpus == 1 else f"{fmt(gpus)} GPUs"


@dataclass(frozen=True, slots=True)
class Judged:
    """The cycle's evidence, shared by every workload: the snapshot, its window, the verdict per pod."""

    snapshot: Snapshot
    window: TelemetryWindow
    args: IdleGpuArgs
    ctx: StrategyContext
    verdicts: Mapping[tuple[str, str], Verdict]


class Lifecycle:
    """One idle (or no longer idle) workload under its rule, on one snapshot."""

    def __init__(
        self, workload: Resolved, holders: Sequence[Pod], members: Sequence[Pod], judged: Judged
    ) -> None:
        self.workload = workload
        self.window = judged.window
        self.holders = tuple(holders)
        self.members = tuple(members)
        self.snapshot = snapshot = judged.snapshot
        self.args = judged.args
        self.verdicts = judged.verdicts
        self._ctx = judged.ctx
        annotations = workload.controller.annotations if workload.controller is not None else {}
        self.idle_since, self.bad_since = _time(annotations, IDLE_SINCE)
        if self.idle_since is not None and self.idle_since > snapshot.now:
            self.idle_since = snapshot.now  # a clock ahead of ours: the grace period starts now
        self.snooze_until, self.bad_snooze = _time(annotations, SNOOZE_UNTIL)

    # Only the workloads that are idle, or busy again, are told or priced: most cycles judge thousands of
    # busy workloads and describe none of them.
    @cached_property
    def gpus(self) -> float:
        return sum(gpu_equivalents(pod, self._model(pod)) for pod in self.holders)

    @cached_property
    def cost_per_hour(self) -> float | None:
        prices = [self._price(pod) for pod in self.holders]
        return None if any(p is None for p in prices) else sum(p or 0.0 for p in prices)

    def _model(self, pod: Pod) -> str:
        node = self.snapshot.nodes.get(pod.node_name or "")
        return (node.gpu_model or "") if node is not None else ""

    def _price(self, pod: Pod) -> float | None:
        model = self._model(pod)
        per_gpu = self._ctx.price_per_gpu_hour(model or None)
        return None if per_gpu is None else per_gpu * gpu_equivalents(pod, model)

    # ----------------------------------------------------------------- idle

    def _evidence(self) -> str:
        rows = self.verdicts
        return "; ".join(f"{pod.ref}: {idle_text(rows[pod.key].rows, self.args)}" for pod in self.holders)

    def report(self, note: str) -> Finding:
        """The finding alone, with `note` saying why nothing more happens."""
        return self._finding(self._evidence(), note)

    def idle(self, rule: IdleAction) -> tuple[Proposal | None, Finding]:
        """The finding for the idle workload, and what its rule proposes now (None: nothing yet)."""
        evidence = self._evidence()
        if rule.action == "report":
            unruled = rule is REPORT
            why = (
                f"namespace {self.workload.key.namespace} not opted in to an action"
                if unruled
                else "its rule"
            )
            return None, self._finding(evidence, f"report only: {why}")
        if self.workload.bare:
            return self._bare(rule, evidence)
        if self.workload.controller is None:
            why = f"report only: {self.workload.ref} could not be read, so no state can be kept on it"
            return None, self._finding(evidence, why)
        if self.workload.kind is None:
            return None, self._finding(
                evidence, f"report only: no reclaim knows the kind {self.workload.key.kind}"
            )
        held = self._held()
        if held is not None:
            return None, self._finding(evidence, held)
        if self.idle_since is None:
            grace = (
                timedelta(seconds=rule.grace) if rule.action == "reclaim" and self.workload.reclaim else None
            )
            note = "owner to be told" + (f" ({self.bad_since}: replaced)" if self.bad_since else "")
            then = ""
            if grace is not None and (how := self.workload.reclaim) is not None:
                then = f", {RECLAIM_WORDS[how]} after {format_duration(rule.grace)} unless snoozed"
            reason = f"tell the owner of {self.workload.ref}{then}: {evidence}"
            how = self.workload.reclaim if grace is not None else None
            return self._proposal("notify", reason, how=how, grace=grace), self._finding(evidence, note)
        told = rfc3339.format_utc(self.idle_since)
        if rule.action == "notify":
            return None, self._finding(evidence, f"owner told at {told}")
        how = self.workload.reclaim
        if how is None:
            kind = self.workload.key.kind
            return None, self._finding(
                evidence, f"owner told at {told}; report only: no reclaim frees the GPUs of an idle {kind}"
            )
        due = self.idle_since + timedelta(seconds=rule.grace)
        if self.snapshot.now < due:
            when = rfc3339.format_utc(due)
            note = f"owner told at {told}; to be {RECLAIM_WORDS[how]} at {when} unless snoozed or busy again"
            return None, self._finding(evidence, note)
        over = f"owner told at {told}, grace of {format_duration(rule.grace)} over"
        reason = f"{self.workload.ref} to be {RECLAIM_WORDS[how]}: {over}; {evidence}"
        return self._proposal("reclaim", reason, how=how), self._finding(evidence, over)

    def _held(self) -> str | None:
        if self.bad_snooze is not None:
            return f"held: {self.bad_snooze} (fix or remove it)"
        if self.snooze_until is not None and self.snooze_until > self.snapshot.now:
            return f"snoozed until {rfc3339.format_utc(self.snooze_until)}"
        return None

    def _bare(self, rule: IdleAction, evidence: str) -> tuple[Proposal | None, Finding]:
        if rule.action != "reclaim":
            return None, self._finding(evidence, "report only: a bare pod has no object to keep a notice on")
        why = "a bare pod: nothing re-creates it, so an eviction frees its GPUs"
        return self._proposal("reclaim", f"{why}; {evidence}", how="evict"), self._finding(evidence, why)

    # ----------------------------------------------------------------- busy again

    def busy_again(self) -> Proposal | None:
        """A `clear` proposal when the workload carries `idle-since` but a pod computed again."""
        if self.workload.controller is None or IDLE_SINCE not in self.workload.controller.annotations:
            return None
        busy = [pod for pod in self.holders if self.verdicts[pod.key].busy]
        if not busy:
            return None
        rows = self.verdicts[busy[0].key].rows
        peak = max((row.util_avg_percent or 0.0) for row in rows)
        reason = (
            f"{self.workload.ref} busy again: {busy[0].ref} averaged "
            f"{fmt(peak)}% over {format_duration(self.args.window)}; idle mark lifted"
        )
        return self._proposal("clear", reason)

    # ----------------------------------------------------------------- pieces

    def _idle_span(self) -> tuple[float, str]:
        """Hours the workload has been idle (since `idle-since`, else at least the window), and in words."""
        since = self.idle_since
        if since is None:
            return self.args.window / 3600, f"at least {format_duration(self.args.window)}"
        span = max(0, int((self.snapshot.now - since).total_seconds()))
        return span / 3600, f"{format_duration(span)} (since {rfc3339.format_utc(since)})"

    def _finding(self, evidence: str, note: str) -> Finding:
        hours, span = self._idle_span()
        cost = ""
        if self.cost_per_hour is not None:
            cost = f", ${hours * self.cost_per_hour:.2f} at ${self.cost_per_hour:.2f}/h"
        first = self.holders[0]
        rows = self.window.by_pod.get(first.key, ())
        detail = (
            f"{self.workload.ref}: {_gpus_text(self.gpus)} on "
            f"{plural(len(self.holders), 'pod')} idle for {span}, "
            f"{fmt(round(hours * self.gpus, 1))} GPU-hours{cost}; {evidence}; {note}"
        )
        return Finding(
            kind="idle-gpu",
            node=first.node_name,
            gpu=rows[0].uuid if rows else None,
            namespace=first.namespace,
            pod=first.name,
            detail=detail,
            workload=self.workload.ref,
            gpus=self.gpus,
        )

    def _proposal(
        self,
        verb: WorkloadVerb,
        reason: str,
        *,
        how: ReclaimHow | None = None,
        grace: timedelta | None = None,
    ) -> Proposal:
        now = self.snapshot.now
        namespace, kind, name = self.workload.key
        action = WorkloadAction(
            verb=verb,
            workload=(namespace, kind, name),
            controller=self.workload.controller,
            how=how,
            gpus=self.gpus,
            idle_since=self.idle_since or now,
            grace_until=now + grace if grace is not None else None,
            cost_per_hour=self.cost_per_hour,
        )
        return Proposal(
            strategy=NAME,
            kind="workload",
            pods=self.members,
            reason=reason,
            priority=self.gpus,
            node=self.holders[0].node_name if len({p.node_name for p in self.holders}) == 1 else None,
            group=self.workload.ref,
            action=action,
        )
