"""`rebalancer.memo`: values kept per object by identity, never by equality, and forgotten with it; and
per pod template, by the identity of the requests mapping its pods share."""

from __future__ import annotations

import gc
import textwrap
from pathlib import Path

import pytest
from mypy import api as mypy_api

from rebalancer.memo import MISSING, NodeMemo, ObjectMemo, RequestsMemo, same_objects
from rebalancer.model import GpuRequest, Node, Pod, Snapshot
from tests.builders import node, pod, replace, snapshot

ROOT = Path(__file__).resolve().parent.parent


def _counting() -> tuple[ObjectMemo[Pod, str], list[str]]:
    calls: list[str] = []

    def derive(p: Pod) -> str:
        calls.append(p.name)
        return f"{p.name}@{p.node_name}"

    return ObjectMemo(derive), calls


def test_a_value_is_derived_once_per_object() -> None:
    memo, calls = _counting()
    first = pod("a", "n1")
    assert memo(first) == "a@n1"
    assert memo(first) == "a@n1"
    assert calls == ["a"]


def test_equal_objects_never_share_a_value() -> None:
    """Two equal pods are two objects: each gets its own derivation (nothing is matched by value)."""
    memo, calls = _counting()
    first = pod("a", "n1")
    twin = replace(first)
    assert twin == first and twin is not first
    memo(first)
    memo(twin)
    assert calls == ["a", "a"]


def test_a_value_goes_with_its_object_in_every_memo() -> None:
    memo, _ = _counting()
    other: ObjectMemo[Pod, int] = ObjectMemo(lambda p: len(p.name))
    kept = pod("kept", "n1")
    gone = pod("gone", "n1")
    memo(kept), memo(gone), other(gone)
    assert (len(memo), len(other)) == (2, 1)
    del gone
    gc.collect()
    assert (len(memo), len(other)) == (1, 0)
    # A new object, maybe at the freed address, is derived afresh.
    assert memo(pod("new", "n2")) == "new@n2"


def test_get_and_put_hold_what_depends_on_more_than_the_object() -> None:
    memo: ObjectMemo[Pod, tuple[str, int]] = ObjectMemo()
    p = pod("a", "n1")
    assert memo.get(p) is MISSING
    memo.put(p, ("ctx", 1))
    assert memo.get(p) == ("ctx", 1)
    with pytest.raises(TypeError, match="no derive function"):
        memo(pod("b", "n1"))


def test_a_value_used_without_checking_for_missing_is_a_type_error(tmp_path: Path) -> None:
    """`get` (and `by_id.get(..., MISSING)`) say in their type that the value may be MISSING: using it
    unchecked is an error of the type checker, using it after `is MISSING` is not."""
    source = tmp_path / "uses_memo.py"
    source.write_text(
        textwrap.dedent(
            """\
            from rebalancer.memo import MISSING, ObjectMemo
            from rebalancer.model import Pod

            memo: ObjectMemo[Pod, tuple[int, str]] = ObjectMemo()


            def unchecked(pod: Pod) -> int:
                return memo.get(pod)[0]


            def unchecked_by_id(pod: Pod) -> int:
                return memo.by_id.get(id(pod), MISSING)[0]


            def checked(pod: Pod) -> int:
                kept = memo.get(pod)
                if kept is MISSING:
                    return 0
                return kept[0]


            def checked_by_id(pod: Pod) -> int:
                kept = memo.by_id.get(id(pod), MISSING)
                return 0 if kept is MISSING else kept[0]
            """
        ),
        encoding="utf-8",
    )
    out, _err, status = mypy_api.run(
        ["--config-file", str(ROOT / "pyproject.toml"), "--no-incremental", str(source)]
    )
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert status == 1, out
    assert [line.split(":")[1] for line in errors] == ["8", "12"], out
    assert all("not indexable" in line for line in errors), out


def test_objects_without_weak_references_are_refused() -> None:
    memo: ObjectMemo[object, int] = ObjectMemo(lambda _: 1)
    with pytest.raises(TypeError):
        memo(("a tuple", "takes", "no weak reference"))


def test_same_objects_compares_identity_and_order() -> None:
    a, b = pod("a", "n"), pod("b", "n")
    assert same_objects((a, b), (a, b))
    assert not same_objects((a, b), (b, a))
    assert not same_objects((a,), (a, b))
    assert not same_objects((a,), (replace(a),))


def _node_memo() -> tuple[NodeMemo[tuple[str, ...]], list[str]]:
    calls: list[str] = []

    def derive(n: Node, pods: tuple[Pod, ...]) -> tuple[str, ...]:
        calls.append(n.name)
        return tuple(p.name for p in pods)

    return NodeMemo(derive), calls


def test_node_memo_reuses_a_node_whose_node_and_pods_are_the_same_objects() -> None:
    memo, calls = _node_memo()
    n1, n2 = node("n1"), node("n2")
    a, b, c = pod("a", "n1"), pod("b", "n1"), pod("c", "n2")
    first = snapshot([n1, n2], [a, b, c])
    assert (memo(first, "n1"), memo(first, "n2")) == (("a", "b"), ("c",))
    # A new snapshot of the same objects: nothing is derived again.
    second = snapshot([n1, n2], [a, b, c])
    assert (memo(second, "n1"), memo(second, "n2")) == (("a", "b"), ("c",))
    assert calls == ["n1", "n2"]
    # A pod replaced by an equal object, or a node object replaced: derived again, that node only.
    third = snapshot([n1, replace(n2)], [replace(a), b, c])
    assert (memo(third, "n1"), memo(third, "n2")) == (("a", "b"), ("c",))
    assert calls == ["n1", "n2", "n1", "n2"]


def test_node_memo_works_out_every_node_at_the_first_call_and_keeps_the_last_snapshot_only() -> None:
    memo, calls = _node_memo()
    n1, n2 = node("n1"), node("n2")
    a, b = pod("a", "n1"), pod("b", "n2")
    first = snapshot([n1, n2], [a, b])
    assert memo(first, "n2") == ("b",)
    assert calls == ["n1", "n2"]  # every node, in the snapshot's order
    assert memo(first, "n1") == ("a",)
    assert calls == ["n1", "n2"]
    memo(snapshot([n2], [b]), "n2")  # a snapshot without n1: n1 is forgotten
    memo(snapshot([n1, n2], [a, b]), "n1")
    assert calls == ["n1", "n2", "n1"]
    with pytest.raises(KeyError):
        memo(first, "n3")


def test_a_snapshot_made_node_by_node_keeps_its_tuples_as_pods_by_node() -> None:
    n1, n2, n3 = node("n1"), node("n2"), node("n3")
    on_n1 = (pod("a", "n1"), pod("b", "n1"))
    on_n2 = (pod("c", "n2"),)
    made = Snapshot.node_by_node(snapshot([]).now, {"n1": n1, "n2": n2, "n3": n3}, {"n2": on_n2, "n1": on_n1})
    assert made.pods == (*on_n1, *on_n2)  # in the order of the nodes
    worked_out = snapshot([n1, n2, n3], made.pods).pods_by_node
    assert made.pods_by_node == worked_out and list(made.pods_by_node) == list(worked_out)
    assert made.pods_by_node["n1"] is on_n1
    with pytest.raises(ValueError, match="not active there"):
        Snapshot.node_by_node(made.now, {"n1": n1, "n2": n2}, {"n1": on_n2})
    with pytest.raises(ValueError, match="not active there"):
        Snapshot.node_by_node(made.now, {"n1": n1}, {"n1": (pod("done", "n1", phase="Succeeded"),)})
    with pytest.raises(ValueError, match="nodes the snapshot does not have"):
        Snapshot.node_by_node(made.now, {"n1": n1}, {"n1": on_n1, "n9": (pod("x", "n9"),)})


# --------------------------------------------------------------------------- RequestsMemo


def _per_template() -> tuple[RequestsMemo[str], list[str]]:
    calls: list[str] = []

    def derive(p: Pod) -> str:
        calls.append(p.name)
        return f"cpu {p.requests['cpu']}, {p.gpu.count}x{p.gpu.milli_per_device}"

    return RequestsMemo(derive), calls


def test_pods_sharing_a_requests_mapping_share_one_value() -> None:
    memo, calls = _per_template()
    first = pod("a", gpus=2)
    second = replace(pod("b", gpus=2, cpu_milli=1), requests=first.requests)

    assert memo(first) == memo(second) == "cpu 4000, 2x1000"
    assert calls == ["a"]


def test_the_same_mapping_with_another_gpu_request_is_derived_again() -> None:
    memo, calls = _per_template()
    share = pod("share", gpus=1, gpu_milli=250)
    whole = replace(share, name="whole", gpu=GpuRequest(count=1, milli_per_device=1000))

    assert memo(share) == "cpu 4000, 1x250"
    assert memo(whole) == "cpu 4000, 1x1000"
    assert memo(share) == "cpu 4000, 1x250"
    assert calls == ["share", "whole", "share"]


def test_equal_mappings_of_their_own_are_derived_each() -> None:
    memo, calls = _per_template()

    assert memo(pod("a")) == memo(pod("b")) == "cpu 4000, 1x1000"
    assert calls == ["a", "b"]


def test_a_full_requests_memo_starts_over_and_still_answers() -> None:
    calls: list[str] = []

    def derive(p: Pod) -> int:
        calls.append(p.name)
        return p.requests["cpu"]

    memo = RequestsMemo(derive, kept=2)
    pods = [pod(f"p{n}", cpu_milli=1000 * (n + 1)) for n in range(5)]

    assert [memo(p) for p in pods] == [1000, 2000, 3000, 4000, 5000]
    assert len(memo) <= 2
    assert [memo(p) for p in pods] == [1000, 2000, 3000, 4000, 5000]
    assert memo(pods[-1]) == 5000
    assert calls == [p.name for p in pods] * 2
