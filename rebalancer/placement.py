"""Scheduling simulation: can a pod run on a node, and where would a packed scheduler put it.

Owns `ClusterState`, a mutable what-if copy of free capacity per node built from a Snapshot, with
reservations carried across every placement of a cycle. It must not do I/O or read the clock, and it
never changes the Snapshot it was built from.

INTERFACE CONTRACT (implementation pending):

    class FitResult: ok: bool; reason: str
        # reason names the failing rule: "Insufficient nvidia.com/gpu", "node(s) didn't match node
        # affinity", "untolerated taint k=v:NoSchedule", ...
    class ClusterState:
        @classmethod
        def from_snapshot(cls, snapshot: Snapshot) -> ClusterState
        def copy(self) -> ClusterState                # independent what-if copy (cheap enough per proposal)
        def fits(self, pod: Pod, node: str) -> FitResult
        def score(self, pod: Pod, node: str) -> float # MostAllocated on GPUs (higher = fuller after placing)
        def best_node(self, pod: Pod, *, exclude: Collection[str] = ()) -> str | None
        def place(self, pod: Pod, node: str) -> None  # reserve; raises ValueError when it does not fit
        def remove(self, pod: Pod) -> None            # free what the pod holds on its current/placed node
        def cordon(self, node: str) -> None           # no further placements onto it (being drained)
        def place_all(self, pods: Sequence[Pod], *, exclude: Collection[str] = ()) -> dict[PodKey, str] | None
            # all-or-nothing, largest GPU request first; on failure no change
"""
