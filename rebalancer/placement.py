"""Scheduling simulation: can a pod run on a node, and where would the packed scheduler put it.

Owns `ClusterState`, a mutable what-if copy of free capacity per node built from a Snapshot, with
reservations carried across every placement of a cycle: the feasibility rules (resources, per-device
GPU shares, taints, unschedulable and cordoned nodes, node selector, required node affinity) and the
packed scheduler's choice. It must not do I/O or read the clock, and it never changes the Snapshot it
was built from. Label and taint matching live in `selectors`, the score in `scoring`, device
arithmetic in `gpu_devices`, one node's accounting and judgement of one pod in `node_accounting`.

Model:

- Scalar resources: every key of `pod.requests` must fit in the node's allocatable minus what is
  accounted on it (cpu in millicores, memory in bytes, extended resources in their own unit). Each pod
  also takes one of `allocatable["pods"]` when the node declares it.
- GPU devices: a node has D devices of 1000 milli-GPU each, D = max(allocatable `nvidia.com/gpu`,
  label `nvidia.com/gpu.count`). `pod.gpu` (count, milli_per_device) needs `count` distinct devices with
  at least `milli_per_device` free each, taken by best fit (least free that still fit), so whole-GPU
  pods take entirely free devices and shares pack together. A pod without `pod.gpu` but with a
  `nvidia.com/gpu` request needs that many whole devices. Running pods get devices when the state is
  built: the ones their `alibabacloud.com/gpu-index` annotation names (a GPU-sharing scheduler's
  assignment), else, after those, by best fit: whole-GPU pods first, then shares largest first. An
  overcommitted node shows negative free.
- A pod is accounted on at most one node. `fits`, `score` and `best_node` judge a pod as a newcomer:
  capacity it already holds is not free for itself. `place` and `place_all` move a pod that is already
  accounted: what it held is released first (and taken back if the move fails).
- The choice is kube-scheduler's integer arithmetic (`scoring`): MostAllocated over the profile's
  resources (cpu and memory with the non-zero defaults, in the score only; extended resources the pod
  does not request left out), plus NodeAffinity: the pod's own preferred terms and the profile's
  `addedAffinity` (more GPUs per node preferred), normalised over the feasible nodes. Ties are picked
  at random upstream: `best_nodes` gives the tied set (a `Prediction`), `best_node` its first.

Speed: copies are copy-on-write per node (a `copy()` costs one dictionary copy); states built from one
snapshot share its accounting, done once. Nodes are ranked as built once per kind of pod (same
constraints and requests) and per raw `addedAffinity` score (a tier: the nodes of one size class),
shared by every copy; a call takes the best of each tier, re-examining only the nodes the state
changed, and weighs the tiers' bests as NodeAffinity's normalisation over the feasible ones does (a
pod with preferred node affinity of its own is scored on every feasible node). The accounting of a
snapshot starts from the one built before it: a node whose Node and pods are the very objects it was
built from (a watch cache and the trace replay hand the same objects for what did not change) keeps
its state, and the candidate nodes and rankings of each kind of pod are those of the latest of the
last builds that made them, with only the nodes changed since judged again. A ClusterState is not
safe to use from several threads at once.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from rebalancer.gpu_devices import best_fit_devices, devices_for_existing, gpu_device_count
from rebalancer.memo import same_objects
from rebalancer.model import (
    MILLI_PER_GPU,
    Node,
    Pod,
    Snapshot,
)
from rebalancer.node_accounting import (
    CPU_RESOURCE,
    Demand,
    Holding,
    NodeState,
    Rank,
    RankingKey,
    StaticKey,
    added_affinity_score,
    assigned_devices,
    could_ever_hold,
    demand_of,
    existing_order,
    has_room,
    node_rank,
    node_score,
    shortfall,
    static_key,
    static_misfit,
)
from rebalancer.scoring import (
    Prediction,
    normalised_affinity,
    top_nodes,
    total_score,
)
from rebalancer.selectors import (
    preferred_affinity_score,
)

PodKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class FitResult:
    """Whether a pod fits a node; when not, `reason` names the first rule that failed."""

    ok: bool
    reason: str = ""


FITS = FitResult(ok=True)


# --------------------------------------------------------------------------- the cluster


# How many builds back a kind of pod's candidate nodes or ranking are carried over from.
_CARRIED_BUILDS = 16


class _Carried:
    """The candidate nodes and rankings of the successive builds of `_LastBuilt`, each kept with the
    number (epoch) of the build it was made for, and what each of the last `_CARRIED_BUILDS` builds
    changed: a build derives a kind of pod's candidates or ranking from the latest one made for an earlier
    build, judging again only the nodes changed since. Entries no recent build can use are dropped."""

    __slots__ = ("candidates", "changes", "rankings")

    def __init__(self) -> None:
        # Per build: the nodes whose state was rebuilt (or are gone) since the build before, and those
        # whose Node object changed (or are gone), a subset.
        self.changes: dict[int, tuple[frozenset[str], frozenset[str]]] = {}
        self.candidates: dict[StaticKey, tuple[int, frozenset[str]]] = {}
        self.rankings: dict[RankingKey, tuple[int, tuple[Rank, ...]]] = {}

    def since(self, epoch: int, now: int, *, node_objects: bool) -> set[str] | None:
        """The nodes rebuilt (or, with `node_objects`, whose Node object changed) by the builds after
        `epoch` up to `now`; None when that is more than is remembered."""
        if now - epoch > _CARRIED_BUILDS:
            return None
        changed: set[str] = set()
        for number in range(epoch + 1, now + 1):
            found = self.changes.get(number)
            if found is None:
                return None
            changed |= found[1] if node_objects else found[0]
        return changed

    def record(self, epoch: int, rebuilt: frozenset[str], changed_nodes: frozenset[str]) -> None:
        self.changes[epoch] = (rebuilt, changed_nodes)
        self.changes.pop(epoch - _CARRIED_BUILDS - 1, None)
        if epoch % _CARRIED_BUILDS == 0:  # now and then, what no build can derive from any more goes
            oldest = epoch - _CARRIED_BUILDS
            self.candidates = {k: v for k, v in self.candidates.items() if v[0] >= oldest}
            self.rankings = {k: v for k, v in self.rankings.items() if v[0] >= oldest}


class _Built:
    """What every copy of one ClusterState shares: the nodes as built and what is derived from them.

    The node states here are never written: a ClusterState clones a node before its first change. A
    build made after another takes over the node states of every node whose Node and pods are the same
    objects as then (`rebuilt`: the others, and the names gone); one of `_LastBuilt`'s builds (numbered
    `epoch`) derives its candidates and rankings from those of earlier builds (`carried`).
    """

    __slots__ = (
        "carried",
        "changed_nodes",
        "epoch",
        "home",
        "keys",
        "nodes",
        "plain",
        "pods",
        "rankings",
        "rebuilt",
        "static_candidates",
        "tiers",
    )

    def __init__(
        self,
        nodes: Mapping[str, NodeState],
        home: Mapping[PodKey, str],
        pods: Mapping[str, tuple[Pod, ...]],
        keys: Mapping[str, tuple[PodKey, ...]],
        plain: Collection[str] = frozenset(),
        *,
        rebuilt: frozenset[str] = frozenset(),
        changed_nodes: frozenset[str] = frozenset(),
    ) -> None:
        self.nodes = nodes
        self.home = home  # the node each pod was accounted on when built
        self.pods = pods  # the pods each node state was built from
        self.keys = keys  # their keys, in the order they were accounted
        self.plain = plain  # the nodes whose state is plain (`_node_state`)
        # Since the build it was made from: the nodes (or names gone) whose state was rebuilt, and those
        # whose Node object changed (a subset).
        self.rebuilt = rebuilt
        self.changed_nodes = changed_nodes
        self.carried: _Carried | None = None  # set by `_LastBuilt`, with the build's number
        self.epoch = 0
        # Nodes whose labels, taints and allocatable admit a kind of pod (cordons aside).
        self.static_candidates: dict[StaticKey, frozenset[str]] = {}
        # Those nodes by their raw `addedAffinity` score.
        self.tiers: dict[StaticKey, tuple[tuple[int, frozenset[str]], ...]] = {}
        # The rank of every node of a tier a kind of pod fits on as built, best first.
        self.rankings: dict[RankingKey, tuple[Rank, ...]] = {}


def _node_state(node: Node, pods: Sequence[Pod]) -> tuple[NodeState, tuple[PodKey, ...], bool]:
    """The node with every active pod on it accounted, as the snapshot shows them, the pods' keys in
    the order they were accounted, and whether the state is plain: every GPU pod on the devices its
    annotation names (none inferred), every pod's key its own, every resource one the node declares."""
    state = NodeState(node, dict(node.allocatable), [MILLI_PER_GPU] * gpu_device_count(node), {})
    keys: list[PodKey] = []
    gpu_pods: list[tuple[Demand, Pod]] = []
    for pod in pods:
        demand = demand_of(pod)
        if demand.gpu_count:
            gpu_pods.append((demand, pod))
        else:
            key = (pod.namespace, pod.name)
            state.take(key, Holding(demand, ()))
            keys.append(key)
    inferred: list[tuple[Demand, Pod]] = []
    for demand, pod in gpu_pods:
        devices = assigned_devices(pod, demand, len(state.devices))
        if devices is None:
            inferred.append((demand, pod))
            continue
        key = (pod.namespace, pod.name)
        state.take(key, Holding(demand, devices))
        keys.append(key)
    inferred.sort(key=existing_order)
    for demand, pod in inferred:
        key = (pod.namespace, pod.name)
        devices = devices_for_existing(state.devices, demand.gpu_count, demand.gpu_milli)
        state.take(key, Holding(demand, devices))
        keys.append(key)
    plain = not inferred and len(state.holdings) == len(keys) and len(state.free) == len(node.allocatable)
    return state, tuple(keys), plain


def _moved_on(
    before: NodeState, before_pods: Sequence[Pod], before_keys: tuple[PodKey, ...], pods: Sequence[Pod]
) -> tuple[NodeState, tuple[PodKey, ...]] | None:
    """The state `_node_state` builds for a node whose plain state `before` was built from
    `before_pods`, when `pods` are those pods, some gone, then GPU pods added after them on the devices
    their annotations name: `before` with the gone pods given back and the new ones taken, in the order
    a build takes them. None when the pods are not such, or the state would not stay plain."""
    kept = 0
    gone: list[Pod] = []
    for pod in before_pods:
        if kept < len(pods) and pods[kept] is pod:
            kept += 1
        else:
            gone.append(pod)
    declared = before.node.allocatable
    state = before.clone()
    left = set(before_keys)
    for pod in gone:
        key = (pod.namespace, pod.name)
        if key not in left or any(name not in declared for name, _ in demand_of(pod).requests):
            return None
        left.discard(key)
        state.give_back(key)
    added: list[PodKey] = []
    for pod in pods[kept:]:
        demand = demand_of(pod)
        key = (pod.namespace, pod.name)
        if not demand.gpu_count or key in state.holdings:
            return None
        if any(name not in declared for name, _ in demand.requests):
            return None
        devices = assigned_devices(pod, demand, len(state.devices))
        if devices is None:
            return None
        state.take(key, Holding(demand, devices))
        added.append(key)
    return state, (*(key for key in before_keys if key in left), *added)


def _build(snapshot: Snapshot, previous: _Built | None = None) -> _Built:
    """Every active pod accounted against its node, as the snapshot shows them. With `previous`, the
    state of a node whose Node and pods are the very objects it was built from is taken over (node
    states are never written, and a pure function of those objects), and that of a node whose pods
    only lost some and gained GPU pods after them is moved on from it when it is plain (`_moved_on`)."""
    nodes: dict[str, NodeState] = {}
    home: dict[PodKey, str] = {}
    sources: dict[str, tuple[Pod, ...]] = {}
    keys: dict[str, tuple[PodKey, ...]] = {}
    plain: set[str] = set()
    rebuilt: set[str] = set()
    changed_nodes: set[str] = set()
    pods_by_node = snapshot.pods_by_node
    before_nodes: Mapping[str, NodeState] = previous.nodes if previous is not None else {}
    before_pods = previous.pods if previous is not None else {}
    before_keys = previous.keys if previous is not None else {}
    before_plain = previous.plain if previous is not None else frozenset()
    for name, node in snapshot.nodes.items():
        pods = pods_by_node.get(name, ())
        old = before_nodes.get(name)
        moved = None
        if old is not None and old.node is node:
            old_pods = before_pods[name]
            if same_objects(old_pods, pods):
                nodes[name] = old
                sources[name] = old_pods
                keys[name] = old_keys = before_keys[name]
                home.update(dict.fromkeys(old_keys, name))
                if name in before_plain:
                    plain.add(name)
                continue
            if name in before_plain:
                moved = _moved_on(old, old_pods, before_keys[name], pods)
        elif previous is not None:
            changed_nodes.add(name)
        if moved is not None:
            nodes[name], keys[name] = moved
            plain.add(name)
        else:
            nodes[name], keys[name], is_plain = _node_state(node, pods)
            if is_plain:
                plain.add(name)
        sources[name] = pods
        home.update(dict.fromkeys(keys[name], name))
        rebuilt.add(name)
    if previous is None:
        return _Built(
            nodes, home, sources, keys, plain, rebuilt=frozenset(nodes), changed_nodes=frozenset(nodes)
        )
    gone = previous.nodes.keys() - nodes.keys()
    return _Built(
        nodes,
        home,
        sources,
        keys,
        plain,
        rebuilt=frozenset(rebuilt | gone),
        changed_nodes=frozenset(changed_nodes | gone),
    )


class _LastBuilt:
    """The `_Built` of the snapshot that states were last built from, held only as long as it lives; the
    last build of all, which the next one starts from; and what the builds carry over (`_Carried`)."""

    __slots__ = ("_carried", "_entry", "_last", "_lock")

    def __init__(self) -> None:
        self._entry: tuple[weakref.ref[Snapshot], _Built] | None = None
        self._last: _Built | None = None
        self._carried = _Carried()
        self._lock = threading.Lock()

    def get(self, snapshot: Snapshot) -> _Built:
        entry = self._entry
        if entry is not None and entry[0]() is snapshot:
            return entry[1]
        with self._lock:
            last = self._last
            built = _build(snapshot, last)
            built.epoch = last.epoch + 1 if last is not None else 0
            if last is not None:
                self._carried.record(built.epoch, built.rebuilt, built.changed_nodes)
            built.carried = self._carried
            self._entry = (weakref.ref(snapshot, self._forget), built)
            self._last = built
        return built

    def _forget(self, ref: weakref.ref[Snapshot]) -> None:
        entry = self._entry
        if entry is not None and entry[0] is ref:
            self._entry = None


_LAST_BUILT = _LastBuilt()


class ClusterState:
    """Free capacity of every node, with reservations made during a cycle. Build with `from_snapshot`.

    Node-level inspection (`free`, `gpu_free_milli`, `score`) raises KeyError for an unknown node;
    `fits` and `place` treat it as a node nothing fits on. `best_node` takes the best node of the
    shared ranking (`_Built`) this state has not changed, cordoned or excluded, against those it changed.
    """

    def __init__(
        self,
        built: _Built,
        nodes: dict[str, NodeState],
        moves: dict[PodKey, str | None],
        cordoned: set[str],
        changed: set[str],
    ) -> None:
        self._built = built
        self._nodes = nodes
        self._moves = moves  # only the differences from built.home: new node, or None once removed
        self._cordoned = cordoned
        self._changed = changed  # nodes whose state is no longer the one built
        self._owned: set[str] = set()  # changed nodes no other copy shares, so writable in place

    # ----------------------------------------------------------------------- construction

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> ClusterState:
        """Account every active pod against its node. Pods on nodes the snapshot lacks are ignored.

        The accounting is done once per snapshot and shared by every state built from it (each strategy
        and the planner of a cycle build one): it is never written, see `_Built`.
        """
        built = _LAST_BUILT.get(snapshot)
        return cls(built, dict(built.nodes), moves={}, cordoned=set(), changed=set())

    def copy(self) -> ClusterState:
        """An independent what-if copy: changes to either never show in the other."""
        # Both sides now share every node state, so each must duplicate a node before writing it.
        self._owned = set()
        return self._fork()

    def _fork(self) -> ClusterState:
        return ClusterState(
            self._built, dict(self._nodes), dict(self._moves), set(self._cordoned), set(self._changed)
        )

    def _adopt(self, trial: ClusterState) -> None:
        """Take over the state of a fork of this state that was never copied itself."""
        self._nodes = trial._nodes
        self._moves = trial._moves
        self._changed = trial._changed
        self._owned |= trial._owned

    def _writable(self, node: str) -> NodeState:
        state = self._nodes[node]
        if node not in self._owned:
            state = state.clone()
            self._nodes[node] = state
            self._owned.add(node)
            self._changed.add(node)
        return state

    # ----------------------------------------------------------------------- queries

    def node_of(self, pod_key: PodKey) -> str | None:
        """The node a pod is accounted on (where it runs, or where it was placed), or None."""
        if pod_key in self._moves:
            return self._moves[pod_key]
        return self._built.home.get(pod_key)

    def free(self, node: str) -> Mapping[str, int]:
        """Allocatable minus accounted, per resource (including `pods` when the node declares it)."""
        return dict(self._nodes[node].free)

    def gpu_free_milli(self, node: str) -> tuple[int, ...]:
        """Free milli-GPU of each device of the node, in device order."""
        return tuple(self._nodes[node].devices)

    def is_cordoned(self, node: str) -> bool:
        return node in self._cordoned

    def fits(self, pod: Pod, node: str) -> FitResult:
        """Whether the pod, as a newcomer, can be placed on the node now; the first failing rule if not."""
        state = self._nodes.get(node)
        if state is None:
            return FitResult(ok=False, reason=f"node {node} not found")
        reason = self._misfit(demand_of(pod), pod, node, state)
        return FITS if reason is None else FitResult(ok=False, reason=reason)

    def score(self, pod: Pod, node: str) -> int:
        """NodeResourcesFit's MostAllocated score (0..100, higher = fuller once the pod is added),
        whether or not the pod fits."""
        return node_score(demand_of(pod), self._nodes[node])

    def best_node(self, pod: Pod, *, exclude: Collection[str] = ()) -> str | None:
        """The node reported for the pod: the first name among the feasible nodes with the top score
        (`best_nodes`). None when no node fits."""
        found = self._predict(demand_of(pod), pod, frozenset(exclude), ties=False)
        return None if found is None else found[0]

    def best_nodes(self, pod: Pod, *, exclude: Collection[str] = ()) -> Prediction | None:
        """Every feasible node the packed scheduler may pick for the pod (the top score, tied), and the
        one reported (the first name). None when no node fits."""
        found = self._predict(demand_of(pod), pod, frozenset(exclude), ties=True)
        return None if found is None else Prediction(chosen=found[0], tied=frozenset(found[1]))

    def _predict(
        self, demand: Demand, pod: Pod, excluded: frozenset[str], *, ties: bool
    ) -> tuple[str, set[str]] | None:
        """The reported node and, with `ties`, every node tied with it (else only it)."""
        kind = static_key(pod, demand)
        candidates = self._static_candidates(kind, pod, demand)
        if pod.preferred_affinity:  # the pod's own terms: every feasible node scored
            return self._predict_scored(demand, pod, candidates, excluded)
        best: list[tuple[int, int, str, set[str]]] = []  # per tier: raw affinity, score, chosen, tied
        for raw, members in self._tiers(kind, candidates):
            found = self._best_of_tier(kind, raw, members, demand, excluded, ties=ties)
            if found is not None:
                best.append((raw, *found))
        if len(best) <= 1:  # one size class feasible: NodeAffinity scores its nodes alike
            return None if not best else (best[0][2], best[0][3])
        # NodeAffinity normalised over the feasible nodes: each tier's best, weighed against the others.
        top_raw = max(raw for raw, _, _, _ in best)
        totals = [
            (total_score(score, normalised_affinity(raw, top_raw)), chosen, names)
            for raw, score, chosen, names in best
        ]
        top = max(total for total, _, _ in totals)
        chosen = min(name for total, name, _ in totals if total == top)
        if not ties:
            return chosen, {chosen}
        return chosen, set().union(*(names for total, _, names in totals if total == top))

    def _predict_scored(
        self, demand: Demand, pod: Pod, candidates: frozenset[str], excluded: frozenset[str]
    ) -> tuple[str, set[str]] | None:
        """Every feasible node scored: NodeAffinity with the pod's own terms and the profile's."""
        cordoned, nodes = self._cordoned, self._nodes
        fit: dict[str, int] = {}
        raw: dict[str, int] = {}
        for name in candidates:
            if name not in cordoned and name not in excluded and has_room(demand, nodes[name]):
                fit[name] = node_score(demand, nodes[name])
                node = nodes[name].node
                raw[name] = added_affinity_score(node) + preferred_affinity_score(pod, node)
        tied = top_nodes(fit, raw)
        return (min(tied), set(tied)) if tied else None

    def _best_of_tier(
        self,
        kind: StaticKey,
        raw: int,
        members: frozenset[str],
        demand: Demand,
        excluded: frozenset[str],
        *,
        ties: bool,
    ) -> tuple[int, str, set[str]] | None:
        """The best MostAllocated score among the tier's feasible nodes, the reported node and, with
        `ties`, every node of the tier with that score (else only it); None when none is feasible."""
        cordoned, changed, nodes = self._cordoned, self._changed, self._nodes
        ranks = [
            rank
            for name in changed
            if name in members and name not in cordoned and name not in excluded
            if (rank := node_rank(demand, name, nodes[name])) is not None
        ]
        # Nodes unchanged since ranked still fit, with the score they were ranked with.
        rest = (
            rank
            for rank in self._ranking(kind, raw, members, demand)
            if rank[1] not in changed and rank[1] not in cordoned and rank[1] not in excluded
        )
        first = next(rest, None)
        if first is not None:
            ranks.append(first)
        if not ranks:
            return None
        top, chosen = min(ranks)
        if not ties:
            return -top, chosen, {chosen}
        names = {name for score, name in ranks if score == top}
        for score, name in rest:  # best first: the rest tied with the top come next
            if score != top:
                break
            names.add(name)
        return -top, chosen, names

    def _tiers(self, kind: StaticKey, candidates: frozenset[str]) -> tuple[tuple[int, frozenset[str]], ...]:
        """The candidates by the raw score the profile's `addedAffinity` gives them (cached per kind)."""
        tiers = self._built.tiers.get(kind)
        if tiers is None:
            nodes = self._built.nodes
            grouped: dict[int, set[str]] = {}
            for name in candidates:
                grouped.setdefault(added_affinity_score(nodes[name].node), set()).add(name)
            tiers = tuple((raw, frozenset(names)) for raw, names in sorted(grouped.items(), reverse=True))
            self._built.tiers[kind] = tiers
        return tiers

    def _static_candidates(self, key: StaticKey, pod: Pod, demand: Demand) -> frozenset[str]:
        """Nodes whose labels, taints and allocatable admit the pod, whatever is free (cached, and
        derived from an earlier build's when there is one: only nodes whose Node object changed since
        are judged again)."""
        built = self._built
        candidates = built.static_candidates.get(key)
        if candidates is not None:
            return candidates
        nodes = built.nodes
        judged: Iterable[str] = nodes
        kept: frozenset[str] = frozenset()
        carried = built.carried
        before = carried.candidates.get(key) if carried is not None else None
        if carried is not None and before is not None and before[0] <= built.epoch:
            changed = carried.since(before[0], built.epoch, node_objects=True)
            if changed is not None:
                judged, kept = changed, before[1] - changed
        candidates = kept | {
            name
            for name in judged
            if (state := nodes.get(name)) is not None
            and could_ever_hold(demand, state)
            and static_misfit(pod, state.node) is None
        }
        built.static_candidates[key] = candidates
        if carried is not None and (before is None or before[0] < built.epoch):
            carried.candidates[key] = (built.epoch, candidates)
        return candidates

    def _ranking(
        self, kind: StaticKey, raw: int, members: frozenset[str], demand: Demand
    ) -> tuple[Rank, ...]:
        """The rank of every node of a tier the pod fits on as built, best first (cached per kind of pod
        and tier, and derived from an earlier build's when there is one: only nodes rebuilt since are
        ranked again; a node's tier is a function of its Node object, so a node changing tier is one
        rebuilt)."""
        key = (kind, demand, raw)
        built = self._built
        ranking = built.rankings.get(key)
        if ranking is not None:
            return ranking
        nodes = built.nodes
        ranked: Iterable[str] = members
        ranks: list[Rank] = []
        carried = built.carried
        before = carried.rankings.get(key) if carried is not None else None
        if carried is not None and before is not None and before[0] <= built.epoch:
            rebuilt = carried.since(before[0], built.epoch, node_objects=False)
            if rebuilt is not None:
                ranked = rebuilt
                ranks = [rank for rank in before[1] if rank[1] not in rebuilt]
        for name in ranked:
            if name in members and (rank := node_rank(demand, name, nodes[name])) is not None:
                ranks.append(rank)
        ranking = tuple(sorted(ranks))
        built.rankings[key] = ranking
        if carried is not None and (before is None or before[0] < built.epoch):
            carried.rankings[key] = (built.epoch, ranking)
        return ranking

    def _misfit(self, demand: Demand, pod: Pod, name: str, state: NodeState) -> str | None:
        """Why the pod cannot go on the node now, or None: cordon, then static rules, then capacity."""
        if name in self._cordoned:
            return "node is cordoned for draining"
        return static_misfit(pod, state.node) or shortfall(demand, state)

    # ----------------------------------------------------------------------- changes

    def cordon(self, node: str) -> None:
        """No further placements onto the node (it is being drained); what it holds stays accounted."""
        self._cordoned.add(node)

    def place(self, pod: Pod, node: str) -> None:
        """Reserve the pod on the node, moving it there if it is accounted elsewhere.

        Raises ValueError, changing nothing, when it does not fit.
        """
        previous = self._release(pod.key)
        demand = demand_of(pod)
        state = self._nodes.get(node)
        reason = f"node {node} not found" if state is None else self._misfit(demand, pod, node, state)
        if reason is not None:
            if previous is not None:
                self._take(pod.key, *previous)
            raise ValueError(f"cannot place {pod.ref} on {node}: {reason}")
        self._reserve(pod.key, node, demand)

    def remove(self, pod: Pod) -> None:
        """Free what the pod holds on the node it is accounted on; nothing when it is not accounted."""
        self._release(pod.key)

    def place_all(self, pods: Sequence[Pod], *, exclude: Collection[str] = ()) -> dict[PodKey, str] | None:
        """Place every pod, all or nothing, each on its best node; the pods' current holdings are
        released first (as when a whole group is evicted). Largest GPU request first, then larger cpu.

        Returns pod key -> node, or None with the state left exactly as it was.
        """
        trial = self._fork()
        targets = trial._place_group(pods, frozenset(exclude))
        if targets is not None:
            self._adopt(trial)
        return targets

    def _place_group(self, pods: Iterable[Pod], excluded: frozenset[str]) -> dict[PodKey, str] | None:
        demands = [(demand_of(pod), pod) for pod in pods]
        if len({pod.key for _, pod in demands}) != len(demands):
            raise ValueError("place_all: a pod is listed more than once")
        for _, pod in demands:
            self._release(pod.key)
        demands.sort(
            key=lambda item: (-item[0].gpu_total_milli, -item[1].requests.get(CPU_RESOURCE, 0), item[1].key)
        )
        targets: dict[PodKey, str] = {}
        for demand, pod in demands:
            found = self._predict(demand, pod, excluded, ties=False)
            if found is None:
                return None
            node = found[0]
            self._reserve(pod.key, node, demand)
            targets[pod.key] = node
        return targets

    def _reserve(self, key: PodKey, node: str, demand: Demand) -> None:
        """Account a pod that fits on the node, on its best-fit devices."""
        state = self._writable(node)
        devices: tuple[int, ...] = ()
        if demand.gpu_count:
            chosen = best_fit_devices(state.devices, demand.gpu_count, demand.gpu_milli)
            if chosen is None:  # the fit check has seen these devices: this is a bug, not a misfit
                raise AssertionError(f"no devices on {node} for {key} after a successful fit")
            devices = chosen
        self._take(key, node, Holding(demand, devices))

    def _take(self, key: PodKey, node: str, holding: Holding) -> None:
        self._writable(node).take(key, holding)
        self._locate(key, node)

    def _release(self, key: PodKey) -> tuple[str, Holding] | None:
        node = self.node_of(key)
        if node is None:
            return None
        holding = self._writable(node).give_back(key)
        self._locate(key, None)
        return node, holding

    def _locate(self, key: PodKey, node: str | None) -> None:
        if self._built.home.get(key) == node:
            self._moves.pop(key, None)
        else:
            self._moves[key] = node
