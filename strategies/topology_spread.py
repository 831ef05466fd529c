"""`topology-spread`: repair topologySpreadConstraints skew and, opt-in, compact gangs onto fewer nodes.

Owns the strategy's arguments and the order of its run: first every group of pods sharing a
constraint is repaired (hard constraints first), then, with `compact_gangs`, every gang is compacted,
and the proposals' priorities keep that order for the planner. The parts it composes:

- `topology_spread_domains`: eligible domains, counts and skew as the scheduler computes them, and the
  `Run` that carries the predicted cluster from one proposal to the next;
- `topology_spread_repair`: the groups and the fewest moves that bring each within maxSkew;
- `topology_spread_gangs`: packing a gang spread over more nodes than needed onto fewer.

One `ClusterState` serves the whole run, so every proposal's reservations are seen by the next, and
moves planned for one constraint are seen by the next constraint's counts. Should an earlier proposal
of the cycle (another strategy's) fill a predicted target, each proposal says where else its pods may
go: a repaired pod only into the domain the repair chose, on a node its other DoNotSchedule
constraints allowed; the rest of its gang anywhere; a compacted gang only onto the nodes it is packed
onto. Every pod it looks at and does not move gets a `NotChosen` record: per constraint of a group
repaired, per gang compacted, and for a pod whose only constraints are ScheduleAnyway ones left alone.

This module must stay pure: no I/O and no clock (`snapshot.now` is the time). Its parts must not
import it but for the arguments' type (under TYPE_CHECKING): it imports them all.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from rebalancer.model import Snapshot, StrategyResult
from rebalancer.placement import ClusterState
from rebalancer.policy import Count, Duration
from rebalancer.registry import StrategyArgs, StrategyContext, strategy
from strategies.topology_spread_domains import HARD, NAME, Run
from strategies.topology_spread_gangs import compact_gang
from strategies.topology_spread_repair import HOSTNAME_KEY, SOFT, repair_group, spread_groups

__all__ = ["HARD", "HOSTNAME_KEY", "NAME", "SOFT", "TopologySpreadArgs", "topology_spread"]


class TopologySpreadArgs(StrategyArgs):
    """Arguments of `topology-spread`."""

    include_soft: bool = False
    """Also repair `whenUnsatisfiable: ScheduleAnyway` constraints."""
    compact_gangs: bool = False
    """Propose packing multi-pod gangs onto fewer nodes of the GPU models they use."""
    min_pod_age: Duration = 600
    """Pods younger than this are never moved."""
    max_evictions_per_constraint: Count = Field(default=10, ge=1)
    """Evictions (pods, a gang counting all its members) one constraint may cost per cycle."""


# --------------------------------------------------------------------------- entry point


@strategy(
    NAME,
    TopologySpreadArgs,
    "evict the fewest pods that bring topologySpreadConstraints back within maxSkew; optionally pack "
    "gangs onto fewer nodes",
)
def topology_spread(snapshot: Snapshot, args: TopologySpreadArgs, ctx: StrategyContext) -> StrategyResult:
    groups, soft_only = spread_groups(snapshot, args.include_soft)
    if not groups and not (args.compact_gangs and snapshot.gangs):
        # No constraint to repair, no gang to pack: nothing to index.
        return StrategyResult(not_chosen=tuple(soft_only))
    run = Run(snapshot=snapshot, args=args, ctx=ctx, state=ClusterState.from_snapshot(snapshot))
    run.left.extend(soft_only)
    hints = [hint for group in groups if (hint := repair_group(run, group))]
    if args.compact_gangs:
        for gang, members in sorted(snapshot.gangs.items()):
            compact_gang(run, gang, members)
    # Later moves were planned on top of earlier ones: priorities keep that order in the planner.
    total = len(run.proposals)
    proposals = tuple(replace(p, priority=float(total - index)) for index, p in enumerate(run.proposals))
    # A pod recorded as staying for one constraint and moved later for another is moved.
    left = tuple(r for r in run.left if (r.namespace or "", r.pod or "") not in run.moved)
    return StrategyResult(proposals=proposals, hints=tuple(hints), not_chosen=left)
