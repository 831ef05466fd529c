"""Gang compaction of `topology-spread` (`compact_gangs`): pack a gang spread over too many nodes onto fewer.

Owns the opt-in compaction. A gang spread over more nodes than needed is proposed whole, every active
member listed, with targets that pack it onto fewer nodes of the GPU models it uses now, preferring the
nodes that already host most members. Evicting only the stragglers would restart the job anyway, and
the planner's `gang` guard refuses a proposal that lacks an active member. A gang a spread repair
already moves (whole) is proposed; each member of one left alone gets a `NotChosen` record saying
why: a member younger than `min_pod_age`, a member carrying a DoNotSchedule spread constraint (it
asks to be spread out), already on one node, or no fewer nodes can take it. Should an earlier
proposal of the cycle fill a predicted target, the compacted gang may go only onto the nodes it is
packed onto.

This module must stay pure: no I/O, no clock (`snapshot.now` is the time). It must not repair skew
(the skew repair does, before any compaction).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from rebalancer.model import DestinationRule, NotChosen, Pod, Proposal
from rebalancer.placement import ClusterState
from rebalancer.policy import format_duration
from rebalancer.wording import plural
from strategies.topology_spread_domains import HARD, NAME, Run, old_enough

__all__ = ["compact_gang"]

PodKey = tuple[str, str]


def _pack(
    sim: ClusterState,
    members: Sequence[Pod],
    candidates: Sequence[str],
    current: Mapping[str, int],
    limit: int,
) -> tuple[ClusterState, dict[PodKey, str], list[str]] | None:
    """Pack the members onto at most `limit` nodes: greedily the node taking the most of them next."""
    remaining = sorted(members, key=lambda m: (-m.gpu.gpus, m.ref))
    placed: dict[PodKey, str] = {}
    used: list[str] = []
    while remaining:
        if len(used) >= limit:
            return None
        best: tuple[tuple[int, int, str], str, ClusterState, list[Pod]] | None = None
        for name in candidates:
            if name in used or not any(sim.fits(m, name).ok for m in remaining):
                continue
            trial = sim.copy()
            taken: list[Pod] = []
            for member in remaining:
                if trial.fits(member, name).ok:
                    trial.place(member, name)
                    taken.append(member)
            # Most members first, then the node already hosting most of them, then by name.
            rank = (-len(taken), -current.get(name, 0), name)
            if best is None or rank < best[0]:
                best = (rank, name, trial, taken)
        if best is None:
            return None
        _, name, sim, taken = best
        used.append(name)
        placed.update((m.key, name) for m in taken)
        taken_keys = {m.key for m in taken}
        remaining = [m for m in remaining if m.key not in taken_keys]
    return sim, placed, used


def _leave(run: Run, gang: str, members: tuple[Pod, ...], code: str, why: str) -> None:
    """Every member of the gang left where it is, and why."""
    reason = f"gang {gang} not compacted: {why}"
    run.left.extend(
        NotChosen(NAME, m.node_name, code, reason, namespace=m.namespace, pod=m.name) for m in members
    )


def compact_gang(run: Run, gang: str, members: tuple[Pod, ...]) -> None:
    """Propose the gang packed onto fewer nodes and reserve it in the run; else record why not."""
    snapshot = run.snapshot
    if len(members) < 2:
        return  # not a multi-pod gang: nothing to compact
    if any(m.key in run.moved for m in members):
        return  # a spread repair moves it, whole: proposed already
    young = next((m for m in members if not old_enough(m, snapshot, run.min_age)), None)
    if young is not None:
        age = format_duration(run.args.min_pod_age)
        _leave(run, gang, members, "too-young", f"{young.ref} is younger than min_pod_age {age}")
        return
    # Members that ask to be spread out (DoNotSchedule) are not packed together.
    spread = next((m for m in members if any(c.when_unsatisfiable == HARD for c in m.topology_spread)), None)
    if spread is not None:
        why = f"{spread.ref} carries a DoNotSchedule spread constraint (it asks to be spread out)"
        _leave(run, gang, members, "asks-to-spread", why)
        return
    current: dict[str, int] = defaultdict(int)
    for member in members:
        current[run.location[member.key]] += 1
    if len(current) < 2:
        _leave(run, gang, members, "gang-together", f"all its pods are on node {next(iter(current))}")
        return
    models = {snapshot.nodes[n].gpu_model for n in current if n in snapshot.nodes}
    candidates = sorted(name for name, node in snapshot.nodes.items() if node.gpu_model in models)
    sim = run.state.copy()
    for member in members:
        sim.remove(member)
    packed = _pack(sim, members, candidates, current, len(current) - 1)
    if packed is None:
        why = f"its {plural(len(members), 'pod')} on {plural(len(current), 'node')} fit on no fewer nodes now"
        _leave(run, gang, members, "cannot-pack", why)
        return
    sim, placed, used = packed
    gpus = sum(m.gpu.gpus for m in members)
    model = ", ".join(sorted(m for m in models if m)) or "nodes without a GPU model"
    reason = (
        f"gang {gang} ({plural(len(members), 'pod')}, {gpus:g} GPUs) spans "
        f"{plural(len(current), 'node')} ({', '.join(sorted(current))}) but fits on "
        f"{plural(len(used), 'node')} of {model} ({', '.join(used)}); moving the whole gang"
    )
    packed_onto = DestinationRule(
        f"among the nodes gang {gang} is packed onto ({', '.join(used)})", frozenset(used)
    )
    run.proposals.append(
        Proposal(
            strategy=NAME,
            kind="gang",
            pods=members,
            reason=reason,
            group=gang,
            targets=placed,
            destinations=dict.fromkeys(placed, (packed_onto,)),
        )
    )
    run.state = sim
    for moved_key, name in placed.items():
        run.location[moved_key] = name
        run.moved.add(moved_key)
