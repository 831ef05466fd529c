"""Scheduling simulation: can a pod run on a node, and where would the packed scheduler put it.

Owns `ClusterState`, a mutable what-if copy of free capacity per node built from a Snapshot, with
reservations carried across every placement of a cycle: the feasibility rules (resources, per-device
GPU shares, taints, unschedulable and cordoned nodes, node selector, required node affinity) and the
packed scheduler's choice. It must not do I/O or read the clock, and it never changes the Snapshot it
was built from. Label and taint matching live in `selectors`, the score in `scoring`, device
arithmetic in `gpu_devices`, one node's accounting and judgement of one pod in `node_accounting`, the
accounting of a snapshot that its states share, and how it is built from the last one, in
`snapshot_accounting`.

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
snapshot starts from the one built before it (`snapshot_accounting`): a node whose Node and pods are
the very objects it was built from (a watch cache and the trace replay hand the same objects for what
did not change) keeps its state, and the candidate nodes and rankings of each kind of pod, derived
here, are those of the latest of the last builds that made them, with only the nodes changed since
judged again.

Used from one thread at a time: the cycle's (the daemon runs one cycle at a time, the commands have
one thread). Nothing here locks: a ClusterState, the accounting its copies share (the tables they
fill in, what successive builds carry over, `snapshot_accounting`) and the ranks kept on shared node
states (`node_accounting.node_rank`) are written without one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from rebalancer.gpu_devices import best_fit_devices
from rebalancer.model import (
    Pod,
    Snapshot,
)
from rebalancer.node_accounting import (
    CPU_RESOURCE,
    Demand,
    Holding,
    NodeState,
    Rank,
    StaticKey,
    added_affinity_score,
    could_ever_hold,
    demand_of,
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
from rebalancer.snapshot_accounting import Built, LastBuilt

PodKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class FitResult:
    """Whether a pod fits a node; when not, `reason` names the first rule that failed."""

    ok: bool
    reason: str = ""


FITS = FitResult(ok=True)


# --------------------------------------------------------------------------- the cluster


# The accounting of the snapshot states were last built from, and the last build of all.
_LAST_BUILT = LastBuilt()


class ClusterState:
    """Free capacity of every node, with reservations made during a cycle. Build with `from_snapshot`.

    Node-level inspection (`free`, `gpu_free_milli`, `score`) raises KeyError for an unknown node;
    `fits` and `place` treat it as a node nothing fits on. `best_node` takes the best node of the
    shared ranking (`Built`) this state has not changed, cordoned or excluded, against those it changed.
    """

    def __init__(
        self,
        built: Built,
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
        and the planner of a cycle build one): what it accounts is never changed, see `Built`.
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

        def judge(earlier: tuple[frozenset[str], set[str]] | None) -> frozenset[str]:
            judged: Iterable[str] = nodes
            kept: frozenset[str] = frozenset()
            if earlier is not None:
                before, changed = earlier
                judged, kept = changed, before - changed
            return kept | {
                name
                for name in judged
                if (state := nodes.get(name)) is not None
                and could_ever_hold(demand, state)
                and static_misfit(pod, state.node) is None
            }

        carried = built.carried
        if carried is None:
            candidates = judge(None)
        else:
            candidates = carried.derived(carried.candidates, key, built.epoch, judge, node_objects=True)
        built.static_candidates[key] = candidates
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

        def rank_tier(earlier: tuple[tuple[Rank, ...], set[str]] | None) -> tuple[Rank, ...]:
            ranked: Iterable[str] = members
            ranks: list[Rank] = []
            if earlier is not None:
                before, rebuilt = earlier
                ranked = rebuilt
                ranks = [rank for rank in before if rank[1] not in rebuilt]
            for name in ranked:
                if name in members and (rank := node_rank(demand, name, nodes[name])) is not None:
                    ranks.append(rank)
            return tuple(sorted(ranks))

        carried = built.carried
        if carried is None:
            ranking = rank_tier(None)
        else:
            ranking = carried.derived(carried.rankings, key, built.epoch, rank_tier, node_objects=False)
        built.rankings[key] = ranking
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
