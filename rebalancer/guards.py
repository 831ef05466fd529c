"""Named safety checks on single pods and nodes (DESIGN §6), and what is kept of their verdicts.

Owns the static guards (the ones that depend only on a pod or node, the snapshot's `now` and the
policy's `GuardsConfig`) and `GUARD_NAMES`, the stable list of every guard name of the system,
the planner's included (they appear in reports and metrics as `blocked_by`, so names are only ever
added, never changed), and the well-known annotation keys they read (the checkpoint protocol's among them,
with `checkpoint_grant`, how a namespace grants checkpoint requests). Label-selector semantics come
from `rebalancer.selectors`.

Each guard returns `Refusal(guard, reason) | None`; the reason is a sentence naming the specific
cause. `pod_refusal` runs the static pod guards on one pod, `first_refusal` on several in order (the
first refused, with its refusal: what a strategy asks of a candidate's pods), `node_refusal` the node
guard.

A pod is judged in every cycle, by strategies and planner alike, so two things are kept across
cycles: per pod object and `GuardsConfig`, the verdict of the guards that read only the pod and the
policy, and from when the pod is old enough for min-pod-age (`rebalancer.memo`, forgotten with the
pod); and per tuple of pods and `GuardsConfig`, `first_refusal`'s answer when no pod's age decided it,
which holds from its snapshot's time on (pods only grow older; a bounded table). Both are functions of
what they are keyed on and of the time, which is checked, so a verdict is the same with or without
them. This module must not do I/O, read the clock (it takes `snapshot.now`), or know about budgets
spent across a cycle: PDBs, limits, gangs, cooldowns and re-placement belong to the planner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Final

from rebalancer.memo import MISSING, ObjectMemo
from rebalancer.model import LabelRequirement, LabelSelector, Node, Pod, Snapshot
from rebalancer.policy import GuardsConfig, LabelSelectorConfig, format_duration
from rebalancer.registry import Refusal
from rebalancer.selectors import label_selector_matches

# --------------------------------------------------------------------------- guard names

MIRROR_OR_STATIC = "mirror-or-static"
DAEMONSET = "daemonset"
SYSTEM_CRITICAL = "system-critical"
BARE_POD = "bare-pod"
LOCAL_STORAGE = "local-storage"
NAMESPACE = "namespace"
LABEL_SELECTOR = "label-selector"
OPT_OUT = "opt-out"
MIN_POD_AGE = "min-pod-age"
TERMINATING = "terminating"
# Guards the planner applies with the cycle's ledger.
GANG = "gang"
PDB = "pdb"
NO_FIT = "no-fit"
LIMIT_NODE = "limit-node"
LIMIT_NAMESPACE = "limit-namespace"
LIMIT_CYCLE = "limit-cycle"
COOLDOWN = "cooldown"
DISRUPTION_BUDGET = "disruption-budget"
DUPLICATE = "duplicate"
CIRCUIT_OPEN: Final = "circuit-open"
CHECKPOINT_PENDING = "checkpoint-pending"
DRAIN_BACKOFF = "drain-backoff"

POD_GUARD_NAMES: tuple[str, ...] = (
    TERMINATING,
    MIRROR_OR_STATIC,
    DAEMONSET,
    SYSTEM_CRITICAL,
    BARE_POD,
    LOCAL_STORAGE,
    NAMESPACE,
    LABEL_SELECTOR,
    OPT_OUT,
    MIN_POD_AGE,
)
"""The static per-pod guards, in the order `pod_refusal` runs them."""

GUARD_NAMES: tuple[str, ...] = (
    *POD_GUARD_NAMES,
    GANG,
    PDB,
    NO_FIT,
    LIMIT_NODE,
    LIMIT_NAMESPACE,
    LIMIT_CYCLE,
    COOLDOWN,
    DUPLICATE,
    DISRUPTION_BUDGET,
    CIRCUIT_OPEN,
    CHECKPOINT_PENDING,
    DRAIN_BACKOFF,
)
"""Every guard name that can appear as `blocked_by` (contract: only ever extended)."""

# --------------------------------------------------------------------------- well-known keys

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
CRITICAL_PRIORITY_CLASSES = ("system-cluster-critical", "system-node-critical")

# Pod annotations that opt a pod out of eviction: (key, value that opts out).
POD_OPT_OUT_ANNOTATIONS: tuple[tuple[str, str], ...] = (
    ("rebalancer.gpu/evict", "false"),
    ("cluster-autoscaler.kubernetes.io/safe-to-evict", "false"),
    ("karpenter.sh/do-not-disrupt", "true"),
)
# Checkpoint-before-evict (docs/checkpoint-protocol.md): the pod asks for a request, the rebalancer asks
# (when), the pod answers.
CHECKPOINT_ANNOTATION = "rebalancer.gpu/checkpoint"
EVICTION_REQUESTED_AT_ANNOTATION = "rebalancer.gpu/eviction-requested-at"
CHECKPOINT_DONE_ANNOTATION = "rebalancer.gpu/checkpoint-done"
# The Role (and its RoleBinding) a namespace applies so the rebalancer may ask its pods.
CHECKPOINT_RBAC_TEMPLATE = "deploy/checkpoint-rbac.example.yaml"


def checkpoint_grant(namespace: str) -> str:
    """How a namespace grants checkpoint requests: the command that applies the template there."""
    return f"kubectl -n {namespace} apply -f {CHECKPOINT_RBAC_TEMPLATE}"


# Node annotations that opt a node out of being drained.
NODE_OPT_OUT_ANNOTATIONS: tuple[tuple[str, str], ...] = (
    ("cluster-autoscaler.kubernetes.io/scale-down-disabled", "true"),
    ("karpenter.sh/do-not-disrupt", "true"),
)

# --------------------------------------------------------------------------- label selectors


def policy_selector(cfg: LabelSelectorConfig) -> LabelSelector:
    """The policy's label selector as the model's LabelSelector, matched by `rebalancer.selectors`."""
    return LabelSelector(
        match_labels=dict(cfg.match_labels),
        match_expressions=tuple(
            LabelRequirement(key=r.key, operator=r.operator, values=tuple(r.values))
            for r in cfg.match_expressions
        ),
    )


def selector_mismatch(selector: LabelSelector, labels: Mapping[str, str]) -> str | None:
    """The first requirement of `selector` that `labels` fail, written as a selector term, or None."""
    for key, value in selector.match_labels.items():
        if labels.get(key) != value:
            return f"{key}={value}"
    for requirement in selector.match_expressions:
        if not label_selector_matches(LabelSelector(match_expressions=(requirement,)), labels):
            values = f" ({', '.join(requirement.values)})" if requirement.values else ""
            return f"{requirement.key} {requirement.operator}{values}"
    return None


# --------------------------------------------------------------------------- pod guards


def terminating(pod: Pod) -> Refusal | None:
    """A pod being deleted is already leaving (upstream's DefaultEvictor refuses it the same way)."""
    if pod.deleting_since is not None:
        since = pod.deleting_since.isoformat().replace("+00:00", "Z")
        return Refusal(TERMINATING, f"pod is already terminating (deletionTimestamp {since})")
    return None


def mirror_or_static(pod: Pod) -> Refusal | None:
    if pod.is_mirror:
        return Refusal(
            MIRROR_OR_STATIC, f"pod is a mirror pod (annotation {MIRROR_ANNOTATION}); the kubelet owns it"
        )
    if pod.owner is not None and pod.owner.kind == "Node":
        return Refusal(MIRROR_OR_STATIC, f"pod is a static pod owned by Node {pod.owner.name}")
    return None


def daemonset(pod: Pod) -> Refusal | None:
    if pod.is_daemonset and pod.owner is not None:
        return Refusal(
            DAEMONSET,
            f"pod is owned by DaemonSet {pod.owner.name}, which would re-create it on the same node",
        )
    return None


def system_critical(pod: Pod, cfg: GuardsConfig) -> Refusal | None:
    if pod.priority_class_name in CRITICAL_PRIORITY_CLASSES:
        return Refusal(SYSTEM_CRITICAL, f"pod has priorityClassName {pod.priority_class_name}")
    if pod.priority >= cfg.priority_threshold:
        return Refusal(
            SYSTEM_CRITICAL,
            f"pod priority {pod.priority} is at or above the threshold {cfg.priority_threshold}",
        )
    return None


def bare_pod(pod: Pod, cfg: GuardsConfig) -> Refusal | None:
    if cfg.evict_bare_pods:
        return None
    if pod.owner is None:
        return Refusal(BARE_POD, "pod has no controller owner that would re-create it")
    if not pod.owner.controller:
        return Refusal(
            BARE_POD,
            f"pod's owner {pod.owner.kind} {pod.owner.name} is not its controller, "
            "so nothing would re-create it",
        )
    return None


def local_storage(pod: Pod, cfg: GuardsConfig) -> Refusal | None:
    if cfg.evict_local_storage:
        return None
    for volume in pod.volumes:
        if volume.kind == "emptyDir":
            if volume.medium == "Memory" and cfg.allow_shm_empty_dir:
                continue
            medium = " (medium Memory)" if volume.medium == "Memory" else ""
            return Refusal(
                LOCAL_STORAGE, f"pod uses emptyDir volume {volume.name}{medium}, whose data eviction loses"
            )
        if volume.kind == "hostPath":
            return Refusal(LOCAL_STORAGE, f"pod uses hostPath volume {volume.name}, tied to its node")
    return None


def namespace(pod: Pod, cfg: GuardsConfig) -> Refusal | None:
    filt = cfg.namespaces
    if pod.namespace in filt.exclude:
        return Refusal(NAMESPACE, f"namespace {pod.namespace} is excluded by the policy")
    if filt.include and pod.namespace not in filt.include:
        return Refusal(
            NAMESPACE,
            f"namespace {pod.namespace} is not among the policy's included namespaces "
            f"({', '.join(filt.include)})",
        )
    return None


def label_selector(pod: Pod, cfg: GuardsConfig) -> Refusal | None:
    selector = cfg.label_selector
    if selector is None:
        return None
    mismatch = selector_mismatch(policy_selector(selector), pod.labels)
    if mismatch is not None:
        return Refusal(
            LABEL_SELECTOR, f"pod labels do not match the policy's label selector: needs {mismatch}"
        )
    return None


def _opt_out(annotations: Mapping[str, str], keys: Iterable[tuple[str, str]]) -> str | None:
    """How the annotations opt out (None: they do not): one of `keys` with its opting-out value, or with
    a value that is neither "true" nor "false". The cluster autoscaler and Karpenter read such a value
    as not opting out; here it holds back, on purpose: its owner meant something, and a guess must not
    evict."""
    for key, value in keys:
        given = annotations.get(key)
        if given is None:
            continue
        understood = given.strip().lower()
        if understood == value:
            return f'annotation {key}: "{given}"'
        if understood not in ("true", "false"):
            return f'annotation {key}: "{given}", neither "true" nor "false": held back until it is one'
    return None


def opt_out(pod: Pod) -> Refusal | None:
    found = _opt_out(pod.annotations, POD_OPT_OUT_ANNOTATIONS)
    if found is not None:
        return Refusal(OPT_OUT, f"pod has {found}")
    return None


def _human(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 0:
        return f"-{format_duration(-seconds)}"
    return format_duration(seconds)


def min_pod_age(pod: Pod, snapshot: Snapshot, cfg: GuardsConfig) -> Refusal | None:
    if cfg.min_pod_age <= 0:
        return None
    minimum = timedelta(seconds=cfg.min_pod_age)
    if pod.created is None:
        return Refusal(
            MIN_POD_AGE,
            f"pod creation time is unknown, so it counts as younger than the minimum age "
            f"{format_duration(cfg.min_pod_age)}",
        )
    age = snapshot.now - pod.created
    if age < minimum:
        return Refusal(
            MIN_POD_AGE,
            f"pod is {_human(age)} old, younger than the minimum age {format_duration(cfg.min_pod_age)}",
        )
    return None


PodGuard = Callable[[Pod, Snapshot, GuardsConfig], Refusal | None]
PodOnlyGuard = Callable[[Pod, GuardsConfig], Refusal | None]

# The guards that read nothing but the pod and the policy's guards, in order: their verdict on a pod
# object is kept (`_VERDICTS`) for as long as the pod object lives. Only min-pod-age reads the
# snapshot (its `now`), and it runs last.
_POD_ONLY_GUARDS: tuple[tuple[str, PodOnlyGuard], ...] = (
    (TERMINATING, lambda pod, _c: terminating(pod)),
    (MIRROR_OR_STATIC, lambda pod, _c: mirror_or_static(pod)),
    (DAEMONSET, lambda pod, _c: daemonset(pod)),
    (SYSTEM_CRITICAL, system_critical),
    (BARE_POD, bare_pod),
    (LOCAL_STORAGE, local_storage),
    (NAMESPACE, namespace),
    (LABEL_SELECTOR, label_selector),
    (OPT_OUT, lambda pod, _c: opt_out(pod)),
)


def _ignoring_snapshot(guard: PodOnlyGuard) -> PodGuard:
    return lambda pod, _s, cfg: guard(pod, cfg)


POD_GUARDS: tuple[tuple[str, PodGuard], ...] = (
    *((name, _ignoring_snapshot(guard)) for name, guard in _POD_ONLY_GUARDS),
    (MIN_POD_AGE, min_pod_age),
)
"""The static pod guards with their names, in the order `pod_refusal` runs them."""


def _verdict(pod: Pod, cfg: GuardsConfig) -> tuple[GuardsConfig, Refusal | None, datetime | None]:
    """`cfg`, the first refusal of the guards that read only the pod and `cfg`, and the instant from
    which the pod is old enough for min-pod-age (None: checked in full each time)."""
    for _name, guard in _POD_ONLY_GUARDS:
        refusal = guard(pod, cfg)
        if refusal is not None:
            return cfg, refusal, None
    old_from: datetime | None = None
    if cfg.min_pod_age > 0 and pod.created is not None:
        try:
            old_from = pod.created + timedelta(seconds=cfg.min_pod_age)
        except OverflowError:
            old_from = None
    return cfg, None, old_from


_VERDICTS: ObjectMemo[Pod, tuple[GuardsConfig, Refusal | None, datetime | None]] = ObjectMemo()
_VERDICTS_BY_ID = _VERDICTS.by_id


def pod_refusal(pod: Pod, snapshot: Snapshot, cfg: GuardsConfig) -> Refusal | None:
    """The first static guard that refuses evicting `pod`, or None when all of them allow it.

    What the guards reading only the pod and `cfg` say is worked out once per pod object and `cfg`
    (`rebalancer.memo`): a pod is judged in every cycle, by strategies and planner alike."""
    verdict = _VERDICTS_BY_ID.get(id(pod), MISSING)
    if verdict is MISSING or verdict[0] is not cfg:
        verdict = _verdict(pod, cfg)
        _VERDICTS.put(pod, verdict)
    if verdict[1] is not None:
        return verdict[1]
    old_from = verdict[2]
    if old_from is not None and snapshot.now >= old_from:
        return None
    return min_pod_age(pod, snapshot, cfg)


def first_refusal(pods: Sequence[Pod], snapshot: Snapshot, cfg: GuardsConfig) -> tuple[Pod, Refusal] | None:
    """The first of `pods` a static guard refuses to evict, with the refusal: `pod_refusal` on each in
    order (a strategy asks it of every pod of every candidate node, every cycle).

    When no pod is refused for its age, the answer (the first pod a pod-only guard refuses, or none)
    holds as long as the time does not go back (pods only grow older): when `pods` is a tuple, it is
    kept for that very tuple and `cfg`, from the snapshot's time on. Any other sequence may change
    between calls: it is judged in full each time, and nothing is kept for it."""
    now = snapshot.now
    if isinstance(pods, tuple):
        settled = _SETTLED.get(id(pods))
        if settled is not None and settled[0] is pods and settled[1] is cfg and now >= settled[2]:
            return settled[3]
    verdicts = _VERDICTS_BY_ID
    found: tuple[Pod, Refusal] | None = None
    for pod in pods:
        verdict = verdicts.get(id(pod), MISSING)
        if verdict is MISSING or verdict[0] is not cfg:
            verdict = _verdict(pod, cfg)
            _VERDICTS.put(pod, verdict)
        if verdict[1] is not None:
            found = pod, verdict[1]
            break
        old_from = verdict[2]
        if old_from is not None and now >= old_from:
            continue
        refusal = min_pod_age(pod, snapshot, cfg)
        if refusal is not None:
            return pod, refusal  # refused for its age, which changes with the time: nothing is kept
    if isinstance(pods, tuple):
        if len(_SETTLED) >= _SETTLED_KEPT:
            _SETTLED.clear()
        _SETTLED[id(pods)] = (pods, cfg, now, found)
    return found


# Settled answers of `first_refusal`, by the id of the tuple of pods asked about (which they hold).
_SETTLED: dict[int, tuple[tuple[Pod, ...], GuardsConfig, datetime, tuple[Pod, Refusal] | None]] = {}
_SETTLED_KEPT = 4096


# --------------------------------------------------------------------------- node guard


def node_refusal(node: Node) -> Refusal | None:
    """Refuses draining a node whose annotations opt it out of scale-down / disruption."""
    found = _opt_out(node.annotations, NODE_OPT_OUT_ANNOTATIONS)
    if found is not None:
        return Refusal(OPT_OUT, f"node {node.name} has {found}")
    return None
