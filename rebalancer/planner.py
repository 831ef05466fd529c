"""The planner: turns the strategies' proposals into decisions, spending the cycle's budgets.

Owns `plan()` and the `Ledger` of one cycle (remaining PDB disruptions, evictions per source node, per
namespace and per cycle, the pods already approved, the simulated cluster with every approved move
reserved, and the workloads keeping the circuit open). What earlier cycles did comes in as a
`history.DisruptionHistory` from the caller. A proposal is approved whole or refused whole by the first
guard that fails; the refusal names the guard and, where one pod sank the proposal, that pod. Every
refusal of the system is one of these guards.

Guards, in the order they run: `duplicate` (pods approved earlier this cycle are dropped; nothing
left refuses), `circuit-open` (pods evicted earlier are still unscheduled `reschedule_timeout` later:
nothing is evicted), the static per-pod guards of `rebalancer.guards`, the node opt-out for node
proposals, `gang`, `cooldown`, `drain-backoff` (a node whose drain failed waits 1, 2, 4... intervals
before the next try), `disruption-budget`, `limit-cycle`, `limit-namespace`, `limit-node`,
`pdb`, `no-fit` (simulated by `rebalancer.destinations` on a copy of the ledger's cluster: the
proposal's pods removed, a drained node cordoned, each pod placed on its predicted target, or, when an
earlier approval used that room or it has none, on the packed scheduler's best node among those its
strategy's destination rules allow, refused only when none remains, naming the rule that left none;
a node already chosen as a destination this cycle cannot be drained), and last `checkpoint-pending` (a
pod that asked to checkpoint first has not answered yet; the live evictor asks it, and the history says
in which namespaces it could not: those pods are held, never evicted unasked). A `workload` proposal
(tell an idle workload's owner, reclaim its GPUs, lift its idle mark) places nothing and runs only the
guards that bear on that change (`_WORKLOAD_CHECKS`). An approved decision
also says, per pod, the nodes tied with its target (`Decision.tied`: kube-scheduler picks among equal
top scores at random), so that where the replacement lands can be judged, and the order it placed the
pods in (`Decision.order`), which the evictors follow. `plan()` judges a
whole cycle; `decide()` one proposal against a caller's `Ledger`; `history_refusal` what the guards
reading the history (`cooldown` of a workload, `disruption-budget`) say of one pod, for the strategies.

This module must stay pure: no I/O, no clock (`snapshot.now` is the time), no evictions, and it never
mutates the Snapshot or the proposals. It does not order proposals either: the caller does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from rebalancer import guards, rfc3339
from rebalancer.destinations import Landed, Misfit, land
from rebalancer.history import NO_HISTORY, DisruptionHistory, Workload, drain_backoff, workload_key
from rebalancer.history_circuit import Trip, open_circuits
from rebalancer.model import Decision, Pdb, Pod, Proposal, Snapshot
from rebalancer.placement import ClusterState
from rebalancer.policy import GuardsConfig, Policy, format_duration
from rebalancer.registry import Refusal
from rebalancer.selectors import label_selector_matches
from rebalancer.wording import plural

PodKey = tuple[str, str]


# --------------------------------------------------------------------------- ledger


def pdb_covers(pdb: Pdb, pod: Pod) -> bool:
    """Whether a PDB selects the pod: same namespace and its selector matches (empty selects all)."""
    return pdb.namespace == pod.namespace and label_selector_matches(pdb.selector, pod.labels)


@dataclass
class Ledger:
    """The budgets of one cycle, spent as proposals are approved.

    `state` is the simulated cluster with every approved pod removed from its node, re-placed where it
    is predicted to land (reserved), and every drained node cordoned.
    """

    state: ClusterState
    pdbs_by_namespace: Mapping[str, tuple[Pdb, ...]]
    pdb_remaining: dict[tuple[str, str], int]
    per_node: Counter[str] = field(default_factory=Counter)
    per_namespace: Counter[str] = field(default_factory=Counter)
    cycle: int = 0
    approved: set[PodKey] = field(default_factory=set)
    # Pods approved this cycle, per the node they are predicted to land on.
    landing: Counter[str] = field(default_factory=Counter)
    # Workloads whose evicted pods are still unscheduled: while any is, nothing is evicted.
    trips: tuple[Trip, ...] = ()
    _covering: dict[PodKey, tuple[Pdb, ...]] = field(default_factory=dict, repr=False)

    @classmethod
    def start(cls, snapshot: Snapshot, trips: tuple[Trip, ...] = ()) -> Ledger:
        by_namespace: dict[str, list[Pdb]] = {}
        for pdb in snapshot.pdbs:
            by_namespace.setdefault(pdb.namespace, []).append(pdb)
        return cls(
            state=ClusterState.from_snapshot(snapshot),
            pdbs_by_namespace={ns: tuple(items) for ns, items in by_namespace.items()},
            pdb_remaining={pdb.key: max(0, pdb.disruptions_allowed) for pdb in snapshot.pdbs},
            trips=trips,
        )

    def pdbs_covering(self, pod: Pod) -> tuple[Pdb, ...]:
        cached = self._covering.get(pod.key)
        if cached is None:
            candidates = self.pdbs_by_namespace.get(pod.namespace, ())
            cached = tuple(pdb for pdb in candidates if pdb_covers(pdb, pod))
            self._covering[pod.key] = cached
        return cached

    def commit(self, pods: Sequence[Pod], targets: Mapping[PodKey, str], state: ClusterState) -> None:
        """Spend the budgets for approved `pods`; `state` is the simulation with their moves reserved."""
        self.landing.update(targets.values())
        for pod in pods:
            for pdb in self.pdbs_covering(pod):
                self.pdb_remaining[pdb.key] -= 1
            if pod.node_name is not None:
                self.per_node[pod.node_name] += 1
            self.per_namespace[pod.namespace] += 1
            self.approved.add(pod.key)
        self.cycle += len(pods)
        self.state = state


# --------------------------------------------------------------------------- guards with a ledger


@dataclass(frozen=True, slots=True)
class _Block:
    guard: str
    reason: str
    pod: Pod | None = None


@dataclass(frozen=True, slots=True)
class _Context:
    proposal: Proposal
    pods: tuple[Pod, ...]
    snapshot: Snapshot
    policy: Policy
    history: DisruptionHistory
    ledger: Ledger

    @property
    def drained(self) -> str | None:
        if self.proposal.kind == "node":
            return self.proposal.node
        return None


def _refs(keys: Iterable[PodKey], limit: int = 3) -> str:
    names = [f"{ns}/{name}" for ns, name in keys]
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def _circuit(ctx: _Context) -> _Block | None:
    trips = ctx.ledger.trips
    if not trips:
        return None
    more = f" (and {plural(len(trips) - 1, 'other workload')})" if len(trips) > 1 else ""
    return _Block(guards.CIRCUIT_OPEN, f"{trips[0].detail}{more}: no eviction until they are placed")


def _static(ctx: _Context) -> _Block | None:
    cfg = ctx.policy.guards
    for pod in ctx.pods:
        refusal = guards.pod_refusal(pod, ctx.snapshot, cfg)
        if refusal is not None:
            return _Block(refusal.guard, refusal.reason, pod)
    return None


def _node(ctx: _Context) -> _Block | None:
    drained = ctx.drained
    node = ctx.snapshot.nodes.get(drained) if drained is not None else None
    if node is None:
        return None
    refusal = guards.node_refusal(node)
    return _Block(refusal.guard, refusal.reason) if refusal is not None else None


def _gang(ctx: _Context) -> _Block | None:
    proposed = {pod.key for pod in ctx.proposal.pods}
    approved = ctx.ledger.approved
    checked: set[str] = set()
    for pod in ctx.pods:
        if pod.gang is None or pod.gang in checked:
            continue
        checked.add(pod.gang)
        members = ctx.snapshot.gangs.get(pod.gang, ())
        missing = [m.key for m in members if m.key not in proposed and m.key not in approved]
        if missing:
            return _Block(
                guards.GANG,
                f"gang {pod.gang} moves whole or not at all, but the proposal lacks "
                f"{_refs(missing)} ({len(missing)} of {plural(len(members), 'active member')})",
                pod,
            )
    return None


def _cooldown(ctx: _Context) -> _Block | None:
    period = ctx.policy.guards.cooldown
    if period <= 0:
        return None
    window = timedelta(seconds=period)
    now = ctx.snapshot.now
    drained = ctx.drained
    if drained is not None:
        last = ctx.history.nodes.get(drained)
        if last is not None and now - last < window:
            return _Block(
                guards.COOLDOWN,
                f"node {drained} was drained {_ago(now - last)}, within the cooldown of "
                f"{format_duration(period)}",
            )
    for pod, key in _workloads(ctx):
        reason = _workload_cooldown(key, ctx.history, now, ctx.policy.guards)
        if reason is not None:
            return _Block(guards.COOLDOWN, reason, pod)
    return None


def _workload_cooldown(
    key: Workload, history: DisruptionHistory, now: datetime, cfg: GuardsConfig
) -> str | None:
    """Why the workload is in its cooldown at `now`; None when it is not (or there is no cooldown)."""
    if cfg.cooldown <= 0:
        return None
    last = history.workloads.get(key)
    if last is None or now - last >= timedelta(seconds=cfg.cooldown):
        return None
    return (
        f"workload {key.kind} {key.ref} was disrupted {_ago(now - last)}, within the cooldown of "
        f"{format_duration(cfg.cooldown)}"
    )


def _workloads(ctx: _Context) -> Iterator[tuple[Pod, Workload]]:
    """The proposal's pods that have a controller, with it."""
    for pod in ctx.pods:
        key = workload_key(pod)
        if key is not None:
            yield pod, key


def _disruption_budget(ctx: _Context) -> _Block | None:
    if ctx.policy.guards.max_disruptions_per_workload is None:
        return None
    for pod, key in _workloads(ctx):
        reason = _budget_spent(key, ctx.history, ctx.snapshot.now, ctx.policy.guards)
        if reason is not None:
            return _Block(guards.DISRUPTION_BUDGET, reason, pod)
    return None


def _budget_spent(key: Workload, history: DisruptionHistory, now: datetime, cfg: GuardsConfig) -> str | None:
    """Why the workload has no disruption left in its budget at `now`; None while it has (or no budget)."""
    limit = cfg.max_disruptions_per_workload
    if limit is None:
        return None
    period = timedelta(seconds=cfg.disruption_window)
    recent = sum(1 for t in history.disruptions.get(key, ()) if now - t < period)
    if recent < limit:
        return None
    return (
        f"workload {key.kind} {key.ref} was disrupted {plural(recent, 'time')} in the last "
        f"{format_duration(cfg.disruption_window)} (max_disruptions_per_workload: {limit})"
    )


def history_refusal(pod: Pod, history: DisruptionHistory, now: datetime, cfg: GuardsConfig) -> Refusal | None:
    """What the guards reading the history say of evicting `pod` alone at `now`: its workload's
    `cooldown`, then its `disruption-budget` (None: neither refuses it). The very rules `plan` judges a
    proposal's pods by, for a strategy to leave out what the planner would refuse and propose the next
    best instead (`cycle.strategy_context`)."""
    key = workload_key(pod)
    if key is None:
        return None
    reason = _workload_cooldown(key, history, now, cfg)
    if reason is not None:
        return Refusal(guards.COOLDOWN, reason)
    reason = _budget_spent(key, history, now, cfg)
    return Refusal(guards.DISRUPTION_BUDGET, reason) if reason is not None else None


def _ago(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 0:
        return f"{format_duration(-seconds)} in the future"
    return f"{format_duration(seconds)} ago"


def _drain_backoff(ctx: _Context) -> _Block | None:
    drained = ctx.drained
    failed = ctx.history.failed_drains.get(drained) if drained is not None else None
    if failed is None:
        return None
    wait = drain_backoff(failed, ctx.policy.interval)
    since = ctx.snapshot.now - failed.last
    if since >= wait:
        return None
    return _Block(
        guards.DRAIN_BACKOFF,
        f"the drain of node {drained} failed {plural(failed.count, 'time')} in a row, the last "
        f"{_ago(since)}: tried again {format_duration(int(wait.total_seconds()))} after it",
    )


def _limit_cycle(ctx: _Context) -> _Block | None:
    limit = ctx.policy.limits.max_per_cycle
    spent = ctx.ledger.cycle
    if limit is None or spent + len(ctx.pods) <= limit:
        return None
    pod = ctx.pods[max(0, limit - spent)]
    return _Block(
        guards.LIMIT_CYCLE,
        f"the limit of {plural(limit, 'eviction')} per cycle is reached "
        f"({spent} approved, this proposal adds {len(ctx.pods)})",
        pod,
    )


def _limit_per(
    ctx: _Context,
    *,
    limit: int | None,
    spent: Counter[str],
    scope: str,
    key_of: Callable[[Pod], str | None],
    guard: str,
) -> _Block | None:
    if limit is None:
        return None
    adding = Counter(key for key in map(key_of, ctx.pods) if key is not None)
    running: Counter[str] = Counter()
    for pod in ctx.pods:
        key = key_of(pod)
        if key is None:
            continue
        running[key] += 1
        if spent[key] + running[key] > limit:
            return _Block(
                guard,
                f"the limit of {plural(limit, 'eviction')} per {scope} is reached for {scope} {key} "
                f"({spent[key]} approved, this proposal adds {adding[key]})",
                pod,
            )
    return None


def _pod_namespace(pod: Pod) -> str | None:
    return pod.namespace


def _pod_node(pod: Pod) -> str | None:
    return pod.node_name


def _limit_namespace(ctx: _Context) -> _Block | None:
    limit = ctx.policy.limits.max_per_namespace
    spent = ctx.ledger.per_namespace
    return _limit_per(
        ctx, limit=limit, spent=spent, scope="namespace", key_of=_pod_namespace, guard=guards.LIMIT_NAMESPACE
    )


def _limit_node(ctx: _Context) -> _Block | None:
    limit = ctx.policy.limits.max_per_node
    spent = ctx.ledger.per_node
    return _limit_per(ctx, limit=limit, spent=spent, scope="node", key_of=_pod_node, guard=guards.LIMIT_NODE)


def _pdb(ctx: _Context) -> _Block | None:
    ledger = ctx.ledger
    covering = [(pod, ledger.pdbs_covering(pod)) for pod in ctx.pods]
    needed: Counter[tuple[str, str]] = Counter()
    for _pod, pdbs in covering:
        for pdb in pdbs:
            needed[pdb.key] += 1
    used: Counter[tuple[str, str]] = Counter()
    for pod, pdbs in covering:
        if len(pdbs) > 1:
            names = ", ".join(f"{p.namespace}/{p.name}" for p in pdbs)
            return _Block(
                guards.PDB,
                f"more than one PodDisruptionBudget selects it ({names}), so the API server refuses "
                "to evict it",
                pod,
            )
        for pdb in pdbs:
            used[pdb.key] += 1
            left = ledger.pdb_remaining[pdb.key]
            if used[pdb.key] > left:
                needs = f", this proposal needs {needed[pdb.key]}" if needed[pdb.key] > 1 else ""
                return _Block(
                    guards.PDB,
                    f"PDB {pdb.namespace}/{pdb.name} allows {left} more "
                    f"{'disruption' if left == 1 else 'disruptions'}{needs}",
                    pod,
                )
    return None


def _place(ctx: _Context) -> Landed | _Block:
    """Simulate the proposal on a copy of the ledger's cluster (`destinations.land`), or the refusal."""
    drained = ctx.drained
    if drained is not None and ctx.ledger.landing[drained]:
        landing = ctx.ledger.landing[drained]
        return _Block(
            guards.NO_FIT,
            f"node {drained} is the predicted destination of {plural(landing, 'pod')} moved earlier "
            "this cycle, so it cannot be drained",
        )
    landed = land(ctx.proposal, ctx.pods, ctx.snapshot, ctx.ledger.state, drained)
    if isinstance(landed, Misfit):
        return _Block(guards.NO_FIT, landed.reason, landed.pod)
    return landed


_CHECKS = (
    _circuit,
    _static,
    _node,
    _gang,
    _cooldown,
    _drain_backoff,
    _disruption_budget,
    _limit_cycle,
    _limit_namespace,
    _limit_node,
    _pdb,
)


# A workload proposal changes the workload's object instead of moving pods: nothing is placed, and
# only the guards that mean something for that change run. Telling the owner passes the static
# per-pod guards (a pod that may not be disrupted is not threatened with it); a reclaim takes the
# pods away, so the budgets count it too, and the PDBs when it is an eviction (a bare pod); lifting
# the idle mark undoes only the rebalancer's own annotation.
_RECLAIM_CHECKS = (_static, _gang, _cooldown, _disruption_budget, _limit_cycle, _limit_namespace, _limit_node)
# By (verb, whether it is an eviction).
_WORKLOAD_CHECKS: Mapping[tuple[str, bool], tuple[Callable[[_Context], _Block | None], ...]] = {
    ("notify", False): (_static,),
    ("reclaim", False): _RECLAIM_CHECKS,
    ("reclaim", True): (*_RECLAIM_CHECKS, _pdb),
    ("clear", False): (),
}


def _decide_workload(ctx: _Context) -> Decision:
    action = ctx.proposal.action
    if action is None:
        raise ValueError(f"{ctx.proposal.strategy}: a workload proposal without its action")
    for check in _WORKLOAD_CHECKS[(action.verb, action.how == "evict")]:
        block = check(ctx)
        if block is not None:
            return _refused(ctx.proposal, block)
    if action.verb == "reclaim":
        ctx.ledger.commit(ctx.pods, {}, ctx.ledger.state)
    return Decision(proposal=ctx.proposal, approved=True)


def _checkpoint(ctx: _Context) -> _Block | None:
    """Last of all, once every other guard approves: a pod that asked to checkpoint before eviction
    (docs/checkpoint-protocol.md) holds its whole plan until it answers or `checkpoint_timeout` passes."""
    timeout = timedelta(seconds=ctx.policy.eviction.checkpoint_timeout)
    now = ctx.snapshot.now
    for pod in ctx.pods:
        annotations = pod.annotations
        if annotations.get(guards.CHECKPOINT_ANNOTATION) != "true":
            continue
        asked = _time(annotations.get(guards.EVICTION_REQUESTED_AT_ANNOTATION))
        refused = ctx.history.checkpoint_refused.get(pod.namespace)
        if asked is None and refused is not None:  # no request was made, so none can time out
            return _Block(
                guards.CHECKPOINT_PENDING,
                f"cannot ask: namespace {pod.namespace} has not granted checkpoint requests (refused at "
                f"{rfc3339.format_utc(refused)}); held until it does, asked again every cycle "
                f"({guards.checkpoint_grant(pod.namespace)})",
                pod,
            )
        if asked is None:
            return _Block(
                guards.CHECKPOINT_PENDING,
                f"it asks to checkpoint before eviction ({guards.CHECKPOINT_ANNOTATION}); asked now, evicted "
                f"after {guards.CHECKPOINT_DONE_ANNOTATION} or at {rfc3339.format_utc(now + timeout)}",
                pod,
            )
        if annotations.get(guards.CHECKPOINT_DONE_ANNOTATION) or now - asked >= timeout:
            continue
        return _Block(
            guards.CHECKPOINT_PENDING,
            f"checkpoint requested at {rfc3339.format_utc(asked)}; waiting for "
            f"{guards.CHECKPOINT_DONE_ANNOTATION} until {rfc3339.format_utc(asked + timeout)}",
            pod,
        )
    return None


def _time(text: str | None) -> datetime | None:
    try:
        return rfc3339.parse(text.strip()) if text else None
    except ValueError:
        return None


# --------------------------------------------------------------------------- plan


def _refused(proposal: Proposal, block: _Block) -> Decision:
    if block.pod is None:
        return Decision(proposal=proposal, approved=False, blocked_by=block.guard, reason=block.reason)
    return Decision(
        proposal=proposal,
        approved=False,
        blocked_by=block.guard,
        reason=f"{block.pod.ref}: {block.reason}",
        blocked_pod=block.pod.key,
    )


def _remaining(proposal: Proposal, approved: set[PodKey]) -> tuple[Pod, ...]:
    seen: set[PodKey] = set()
    kept: list[Pod] = []
    for pod in proposal.pods:
        if pod.key in approved or pod.key in seen:
            continue
        seen.add(pod.key)
        kept.append(pod)
    return tuple(kept)


def decide(
    proposal: Proposal, snapshot: Snapshot, policy: Policy, ledger: Ledger, history: DisruptionHistory
) -> Decision:
    """Judge one proposal against the ledger; on approval the ledger's budgets are spent."""
    pods = _remaining(proposal, ledger.approved)
    if proposal.pods and not pods:
        return _refused(
            proposal,
            _Block(
                guards.DUPLICATE,
                "every pod of the proposal was already approved by an earlier proposal this cycle "
                f"({_refs(pod.key for pod in proposal.pods)})",
            ),
        )
    ctx = _Context(proposal, pods, snapshot, policy, history, ledger)
    if proposal.kind == "workload":
        return _decide_workload(ctx)
    for check in _CHECKS:
        block = check(ctx)
        if block is not None:
            return _refused(proposal, block)
    landed = _place(ctx)
    if isinstance(landed, _Block):
        return _refused(proposal, landed)
    waiting = _checkpoint(ctx)
    if waiting is not None:
        return _refused(proposal, waiting)
    ledger.commit(pods, landed.targets, landed.state)
    reason = "; ".join(landed.replaced)
    return Decision(
        proposal=proposal,
        approved=True,
        targets=landed.targets,
        reason=reason,
        tied=landed.tied,
        order=landed.order,
    )


def plan(
    proposals: Sequence[Proposal],
    snapshot: Snapshot,
    policy: Policy,
    *,
    history: DisruptionHistory = NO_HISTORY,
) -> tuple[Decision, ...]:
    """One decision per proposal, in the given order; each approval spends the cycle's budgets."""
    ledger = Ledger.start(snapshot, open_circuits(snapshot, history, policy.eviction.reschedule_timeout))
    return tuple(decide(proposal, snapshot, policy, ledger, history) for proposal in proposals)
