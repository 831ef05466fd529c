"""The accounting of a snapshot that every `placement.ClusterState` built from it shares, and how it is built.

Owns `Built` (every node's state with the snapshot's active pods accounted, the node each pod was
accounted on, and the candidate nodes, tiers and rankings derived from them, filled in by
`ClusterState`), `build` (that accounting from a snapshot, taking over or moving on the node states
of the build before it), `LastBuilt` (the build of the snapshot states were last built from, and
the last build of all, which the next one starts from) and what successive builds carry over to
each other (the candidate nodes and rankings of each kind of pod, and which nodes each build changed).
What a build's node states account is never changed once built: a `ClusterState` clones a node before
changing it. Only `node_accounting.node_rank` writes on them, keeping a node's rank per demand in
`NodeState.ranks`: a function of the demand and of what the state accounts, which does not change while
the state is shared, so every copy and later build sharing the state may use it (a clone starts without
any, and a change to a state drops its ranks). It must not do I/O or read the clock, never changes a
Snapshot, and makes no placement: the feasibility rules and the packed scheduler's choice are
`placement`'s, one node's accounting `node_accounting`'s.

Used from one thread at a time, as `placement` is: the cycle's (the daemon runs one cycle at a time,
the commands have one thread). Nothing here locks: `LastBuilt`, the carried tables (`_Carried`), the
tables of a `Built` that `ClusterState` fills in and the ranks kept on node states are all written
without one.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TypeVar

from rebalancer.gpu_devices import devices_for_existing, gpu_device_count
from rebalancer.memo import same_objects
from rebalancer.model import MILLI_PER_GPU, Node, Pod, Snapshot
from rebalancer.node_accounting import (
    Demand,
    Holding,
    NodeState,
    Rank,
    RankingKey,
    StaticKey,
    assigned_devices,
    demand_of,
    existing_order,
)

PodKey = tuple[str, str]
_Key = TypeVar("_Key")
_Value = TypeVar("_Value")


# How many builds back a kind of pod's candidate nodes or ranking are carried over from.
_CARRIED_BUILDS = 16


class _Carried:
    """The candidate nodes and rankings of the successive builds of `LastBuilt`, each kept with the
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

    def derived(
        self,
        table: dict[_Key, tuple[int, _Value]],
        key: _Key,
        epoch: int,
        make: Callable[[tuple[_Value, set[str]] | None], _Value],
        *,
        node_objects: bool,
    ) -> _Value:
        """The value `make` gives for `key` in build `epoch` (`candidates` or `rankings` is `table`),
        handed the latest value made for an earlier build and the nodes changed since (`since`), or None
        when there is none or more changed than is remembered (then it judges every node). The value
        is kept in `table` for the builds after this one unless it holds one made for this build or a
        later one."""
        before = table.get(key)
        earlier: tuple[_Value, set[str]] | None = None
        if before is not None and before[0] <= epoch:
            changed = self.since(before[0], epoch, node_objects=node_objects)
            if changed is not None:
                earlier = (before[1], changed)
        value = make(earlier)
        if before is None or before[0] < epoch:
            table[key] = (epoch, value)
        return value

    def record(self, epoch: int, rebuilt: frozenset[str], changed_nodes: frozenset[str]) -> None:
        self.changes[epoch] = (rebuilt, changed_nodes)
        self.changes.pop(epoch - _CARRIED_BUILDS - 1, None)
        if epoch % _CARRIED_BUILDS == 0:  # now and then, what no build can derive from any more goes
            oldest = epoch - _CARRIED_BUILDS
            self.candidates = {k: v for k, v in self.candidates.items() if v[0] >= oldest}
            self.rankings = {k: v for k, v in self.rankings.items() if v[0] >= oldest}


class Built:
    """What every copy of one ClusterState shares: the nodes as built and what is derived from them.

    What the node states here account is never changed: a ClusterState clones a node before its first
    change (`node_rank` only keeps ranks on them, see the module docstring). A build made after another
    takes over the node states of every node whose Node and pods are the same
    objects as then (`rebuilt`: the others, and the names gone); one of `LastBuilt`'s builds (numbered
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
        self.carried: _Carried | None = None  # set by `LastBuilt`, with the build's number
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


def build(snapshot: Snapshot, previous: Built | None = None) -> Built:
    """Every active pod accounted against its node, as the snapshot shows them. With `previous`, the
    state of a node whose Node and pods are the very objects it was built from is taken over (what a
    node state accounts is never changed, and is a pure function of those objects), and that of a node
    whose pods only lost some and gained GPU pods after them is moved on from it when it is plain
    (`_moved_on`)."""
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
        return Built(
            nodes, home, sources, keys, plain, rebuilt=frozenset(nodes), changed_nodes=frozenset(nodes)
        )
    gone = previous.nodes.keys() - nodes.keys()
    return Built(
        nodes,
        home,
        sources,
        keys,
        plain,
        rebuilt=frozenset(rebuilt | gone),
        changed_nodes=frozenset(changed_nodes | gone),
    )


class LastBuilt:
    """The `Built` of the snapshot that states were last built from, held only as long as it lives; the
    last build of all, which the next one starts from; and what the builds carry over (`_Carried`).
    Used from one thread at a time (see the module docstring)."""

    __slots__ = ("_carried", "_entry", "_last")

    def __init__(self) -> None:
        self._entry: tuple[weakref.ref[Snapshot], Built] | None = None
        self._last: Built | None = None
        self._carried = _Carried()

    def get(self, snapshot: Snapshot) -> Built:
        entry = self._entry
        if entry is not None and entry[0]() is snapshot:
            return entry[1]
        last = self._last
        built = build(snapshot, last)
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
