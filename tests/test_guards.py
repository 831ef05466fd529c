"""The static guards: each refuses exactly its case, with its stable name and a reason naming the cause."""

from __future__ import annotations

from datetime import timedelta

import pytest

from rebalancer import guards
from rebalancer.guards import GUARD_NAMES, POD_GUARD_NAMES, node_refusal, pod_refusal
from rebalancer.model import OwnerRef, Pod, Snapshot, Volume
from rebalancer.policy import GuardsConfig, LabelSelectorConfig, NamespaceFilter
from rebalancer.registry import Refusal, StrategyContext
from tests.builders import NOW, node, pod, snapshot

SNAP = snapshot([node("gpu-a-1")])
DEFAULT = GuardsConfig()


def refuse(p: Pod, cfg: GuardsConfig = DEFAULT) -> Refusal | None:
    return pod_refusal(p, SNAP, cfg)


def test_an_ordinary_controlled_pod_passes_every_guard() -> None:
    assert refuse(pod("train-0", "gpu-a-1")) is None


# --------------------------------------------------------------------------- names


def test_guard_names_are_unique_and_cover_the_planner() -> None:
    assert len(set(GUARD_NAMES)) == len(GUARD_NAMES)
    assert set(POD_GUARD_NAMES) <= set(GUARD_NAMES)
    for name in (
        "terminating",
        "mirror-or-static",
        "daemonset",
        "system-critical",
        "bare-pod",
        "local-storage",
        "namespace",
        "label-selector",
        "opt-out",
        "min-pod-age",
        "gang",
        "pdb",
        "no-fit",
        "limit-node",
        "limit-namespace",
        "limit-cycle",
        "cooldown",
        "duplicate",
    ):
        assert name in GUARD_NAMES


def test_pod_guards_run_in_the_documented_order() -> None:
    assert [name for name, _ in guards.POD_GUARDS] == list(POD_GUARD_NAMES)
    assert POD_GUARD_NAMES == (
        "terminating",
        "mirror-or-static",
        "daemonset",
        "system-critical",
        "bare-pod",
        "local-storage",
        "namespace",
        "label-selector",
        "opt-out",
        "min-pod-age",
    )


def test_first_failing_guard_wins() -> None:
    # A DaemonSet pod that is also opted out and too young: daemonset comes first.
    p = pod(
        "agent",
        "gpu-a-1",
        owner=OwnerRef(kind="DaemonSet", name="dcgm-exporter"),
        annotations={"rebalancer.gpu/evict": "false"},
        age=timedelta(seconds=1),
    )
    refusal = refuse(p)
    assert refusal is not None
    assert refusal.guard == "daemonset"


# --------------------------------------------------------------------------- mirror-or-static


def test_mirror_annotation_is_refused() -> None:
    p = pod("etcd", "gpu-a-1", annotations={"kubernetes.io/config.mirror": "abc123"})
    assert refuse(p) == Refusal(
        "mirror-or-static",
        "pod is a mirror pod (annotation kubernetes.io/config.mirror); the kubelet owns it",
    )


def test_pod_owned_by_a_node_is_static() -> None:
    p = pod("kube-proxy", "gpu-a-1", owner=OwnerRef(kind="Node", name="gpu-a-1"))
    assert refuse(p) == Refusal("mirror-or-static", "pod is a static pod owned by Node gpu-a-1")


def test_unrelated_annotations_are_not_mirror() -> None:
    assert (
        guards.mirror_or_static(pod("x", "gpu-a-1", annotations={"kubernetes.io/config.hash": "1"})) is None
    )


# --------------------------------------------------------------------------- daemonset


def test_daemonset_pod_is_refused() -> None:
    p = pod("dcgm", "gpu-a-1", owner=OwnerRef(kind="DaemonSet", name="dcgm-exporter"))
    refusal = refuse(p)
    assert refusal is not None
    assert refusal.guard == "daemonset"
    assert "DaemonSet dcgm-exporter" in refusal.reason


@pytest.mark.parametrize("kind", ["ReplicaSet", "StatefulSet", "Job"])
def test_other_controllers_are_not_daemonsets(kind: str) -> None:
    assert guards.daemonset(pod("x", "gpu-a-1", owner=OwnerRef(kind=kind, name="w"))) is None


# --------------------------------------------------------------------------- system-critical


@pytest.mark.parametrize("cls", ["system-cluster-critical", "system-node-critical"])
def test_critical_priority_classes_are_refused(cls: str) -> None:
    refusal = refuse(pod("dns", "gpu-a-1", priority_class_name=cls))
    assert refusal == Refusal("system-critical", f"pod has priorityClassName {cls}")


def test_priority_at_threshold_is_refused_and_below_is_allowed() -> None:
    cfg = GuardsConfig(priority_threshold=1000)
    at = refuse(pod("hi", "gpu-a-1", priority=1000), cfg)
    assert at == Refusal("system-critical", "pod priority 1000 is at or above the threshold 1000")
    assert refuse(pod("lo", "gpu-a-1", priority=999), cfg) is None


def test_ordinary_priority_class_is_allowed() -> None:
    assert guards.system_critical(pod("x", "gpu-a-1", priority_class_name="batch-high"), DEFAULT) is None


# --------------------------------------------------------------------------- bare-pod


def test_pod_without_owner_is_refused() -> None:
    refusal = refuse(pod("scratch", "gpu-a-1", owner=None))
    assert refusal == Refusal("bare-pod", "pod has no controller owner that would re-create it")


def test_owner_that_is_not_the_controller_counts_as_bare() -> None:
    p = pod("x", "gpu-a-1", owner=OwnerRef(kind="Foo", name="f", controller=False))
    refusal = refuse(p)
    assert refusal is not None
    assert refusal.guard == "bare-pod"
    assert "Foo f is not its controller" in refusal.reason


def test_bare_pods_allowed_when_configured() -> None:
    assert refuse(pod("scratch", "gpu-a-1", owner=None), GuardsConfig(evict_bare_pods=True)) is None


# --------------------------------------------------------------------------- local-storage


def test_empty_dir_is_refused_by_default() -> None:
    refusal = refuse(pod("x", "gpu-a-1", volumes=[Volume("scratch", "emptyDir")]))
    assert refusal is not None
    assert refusal.guard == "local-storage"
    assert "emptyDir volume scratch" in refusal.reason


def test_host_path_is_refused_by_default() -> None:
    refusal = refuse(pod("x", "gpu-a-1", volumes=[Volume("data", "hostPath")]))
    assert refusal is not None
    assert refusal.guard == "local-storage"
    assert "hostPath volume data" in refusal.reason


def test_shm_empty_dir_is_allowed_by_default_and_refused_when_disallowed() -> None:
    shm = pod("x", "gpu-a-1", volumes=[Volume("dshm", "emptyDir", medium="Memory")])
    assert refuse(shm) is None
    refusal = refuse(shm, GuardsConfig(allow_shm_empty_dir=False))
    assert refusal is not None
    assert refusal.guard == "local-storage"
    assert "emptyDir volume dshm (medium Memory)" in refusal.reason


def test_shm_allowance_does_not_cover_disk_empty_dir_next_to_it() -> None:
    p = pod("x", "gpu-a-1", volumes=[Volume("dshm", "emptyDir", medium="Memory"), Volume("tmp", "emptyDir")])
    refusal = refuse(p)
    assert refusal is not None
    assert "emptyDir volume tmp" in refusal.reason


def test_local_storage_allowed_when_configured() -> None:
    p = pod("x", "gpu-a-1", volumes=[Volume("tmp", "emptyDir"), Volume("data", "hostPath")])
    assert refuse(p, GuardsConfig(evict_local_storage=True)) is None


def test_network_volumes_are_not_local_storage() -> None:
    p = pod("x", "gpu-a-1", volumes=[Volume("ckpt", "persistentVolumeClaim"), Volume("cfg", "configMap")])
    assert refuse(p) is None


# --------------------------------------------------------------------------- namespace


def test_kube_system_is_excluded_by_default() -> None:
    refusal = refuse(pod("x", "gpu-a-1", namespace="kube-system"))
    assert refusal == Refusal("namespace", "namespace kube-system is excluded by the policy")


def test_include_list_refuses_other_namespaces() -> None:
    cfg = GuardsConfig(namespaces=NamespaceFilter(include=("ml", "research")))
    assert refuse(pod("x", "gpu-a-1", namespace="ml"), cfg) is None
    refusal = refuse(pod("x", "gpu-a-1", namespace="web"), cfg)
    assert refusal == Refusal(
        "namespace", "namespace web is not among the policy's included namespaces (ml, research)"
    )


def test_empty_include_list_allows_any_namespace_not_excluded() -> None:
    cfg = GuardsConfig(namespaces=NamespaceFilter(include=(), exclude=("secret",)))
    assert refuse(pod("x", "gpu-a-1", namespace="anything"), cfg) is None
    assert refuse(pod("x", "gpu-a-1", namespace="kube-system"), cfg) is None


# --------------------------------------------------------------------------- label-selector


def test_label_selector_match_labels() -> None:
    cfg = GuardsConfig(label_selector=LabelSelectorConfig(match_labels={"team": "vision"}))
    assert refuse(pod("x", "gpu-a-1", labels={"team": "vision"}), cfg) is None
    refusal = refuse(pod("x", "gpu-a-1", labels={"team": "nlp"}), cfg)
    assert refusal == Refusal(
        "label-selector", "pod labels do not match the policy's label selector: needs team=vision"
    )


def test_label_selector_expressions_name_the_failing_requirement() -> None:
    cfg = GuardsConfig.model_validate(
        {
            "label_selector": {
                "match_expressions": [
                    {"key": "tier", "operator": "In", "values": ["batch", "spot"]},
                    {"key": "pinned", "operator": "DoesNotExist"},
                ]
            }
        }
    )
    assert refuse(pod("x", "gpu-a-1", labels={"tier": "spot"}), cfg) is None
    wrong_tier = refuse(pod("x", "gpu-a-1", labels={"tier": "prod"}), cfg)
    assert wrong_tier is not None
    assert wrong_tier.guard == "label-selector"
    assert wrong_tier.reason.endswith("needs tier In (batch, spot)")
    pinned = refuse(pod("x", "gpu-a-1", labels={"tier": "batch", "pinned": "yes"}), cfg)
    assert pinned is not None
    assert pinned.reason.endswith("needs pinned DoesNotExist")


def test_no_label_selector_allows_every_pod() -> None:
    assert guards.label_selector(pod("x", "gpu-a-1", labels={}), DEFAULT) is None


# --------------------------------------------------------------------------- opt-out


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("rebalancer.gpu/evict", "false"),
        ("cluster-autoscaler.kubernetes.io/safe-to-evict", "false"),
        ("karpenter.sh/do-not-disrupt", "true"),
    ],
)
def test_opt_out_annotations_are_refused(key: str, value: str) -> None:
    refusal = refuse(pod("x", "gpu-a-1", annotations={key: value}))
    assert refusal == Refusal("opt-out", f'pod has annotation {key}: "{value}"')


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("rebalancer.gpu/evict", "true"),
        ("cluster-autoscaler.kubernetes.io/safe-to-evict", "true"),
        ("karpenter.sh/do-not-disrupt", "false"),
        ("example.com/evict", "false"),
    ],
)
def test_opposite_or_unknown_annotations_do_not_opt_out(key: str, value: str) -> None:
    assert refuse(pod("x", "gpu-a-1", annotations={key: value})) is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("rebalancer.gpu/evict", "no"),
        ("rebalancer.gpu/evict", "0"),
        ("cluster-autoscaler.kubernetes.io/safe-to-evict", "maybe"),
        ("karpenter.sh/do-not-disrupt", "yes"),
        ("karpenter.sh/do-not-disrupt", ""),
    ],
)
def test_an_opt_out_annotation_whose_value_is_not_understood_holds_the_pod_back(key: str, value: str) -> None:
    # Neither "true" nor "false": the owner meant something, and a guess must not evict. (The cluster
    # autoscaler and Karpenter read such a value as not opting out; this is stricter on purpose.)
    refusal = refuse(pod("x", "gpu-a-1", annotations={key: value}))
    assert refusal == Refusal(
        "opt-out",
        f'pod has annotation {key}: "{value}", neither "true" nor "false": held back until it is one',
    )


# --------------------------------------------------------------------------- min-pod-age


def test_young_pod_is_refused_with_its_age() -> None:
    refusal = refuse(pod("x", "gpu-a-1", age=timedelta(minutes=5)))
    assert refusal == Refusal("min-pod-age", "pod is 5m old, younger than the minimum age 10m")


def test_pod_exactly_at_min_age_is_allowed() -> None:
    assert refuse(pod("x", "gpu-a-1", age=timedelta(minutes=10))) is None


def test_unknown_creation_time_counts_as_too_young() -> None:
    p = Pod(namespace="ml", name="x", node_name="gpu-a-1", owner=OwnerRef(kind="ReplicaSet", name="r"))
    refusal = refuse(p)
    assert refusal is not None
    assert refusal.guard == "min-pod-age"
    assert "creation time is unknown" in refusal.reason


def test_age_is_measured_from_snapshot_now_not_the_clock() -> None:
    p = pod("x", "gpu-a-1", age=timedelta(days=1))
    earlier = snapshot([node("gpu-a-1")], now=NOW - timedelta(days=1, minutes=-2))
    refusal = pod_refusal(p, earlier, DEFAULT)
    assert refusal == Refusal("min-pod-age", "pod is 2m old, younger than the minimum age 10m")


def test_zero_min_age_disables_the_guard() -> None:
    cfg = GuardsConfig(min_pod_age=0)
    assert refuse(pod("x", "gpu-a-1", age=timedelta(0)), cfg) is None
    assert refuse(Pod(namespace="ml", name="x", owner=OwnerRef(kind="Job", name="j")), cfg) is None


def test_the_same_pod_object_is_judged_anew_as_time_passes_and_policies_change() -> None:
    """What is kept per pod object (`rebalancer.memo`) never freezes a verdict that depends on the
    snapshot's time or the policy: one pod object, young, then old enough, then under other guards."""
    p = pod("x", "gpu-a-1", age=timedelta(minutes=5))
    young = refuse(p)
    assert young == Refusal("min-pod-age", "pod is 5m old, younger than the minimum age 10m")
    later = snapshot([node("gpu-a-1")], now=NOW + timedelta(minutes=5))
    assert pod_refusal(p, later, DEFAULT) is None
    assert refuse(p) == young
    stricter = GuardsConfig(namespaces=NamespaceFilter(exclude=("ml",)))
    assert refuse(p, stricter) == Refusal("namespace", "namespace ml is excluded by the policy")
    assert pod_refusal(p, later, DEFAULT) is None
    assert pod_refusal(p, later, GuardsConfig(min_pod_age=3600)) == Refusal(
        "min-pod-age", "pod is 10m old, younger than the minimum age 1h"
    )


@pytest.mark.parametrize("later", [timedelta(0), timedelta(minutes=6), timedelta(hours=2)])
def test_first_refusal_is_pod_refusal_on_each_pod_in_order(later: timedelta) -> None:
    pods = [
        pod("old", "gpu-a-1"),
        pod("young", "gpu-a-1", age=timedelta(minutes=5)),
        pod("excluded", "gpu-a-1", namespace="kube-system"),
        pod("younger", "gpu-a-1", age=timedelta(minutes=1)),
    ]
    snap = snapshot([node("gpu-a-1")], pods, now=NOW + later)
    for start in range(len(pods) + 1):
        rest = pods[start:]
        expected = next(((p, r) for p in rest if (r := pod_refusal(p, snap, DEFAULT)) is not None), None)
        assert guards.first_refusal(rest, snap, DEFAULT) == expected

        # A context without the orchestrator's one-loop check asks `refusal` pod by pod: the same.
        def refusal(p: Pod, snap: Snapshot = snap) -> Refusal | None:
            return pod_refusal(p, snap, DEFAULT)

        ctx = StrategyContext(refusal=refusal)
        assert ctx.first_refusal(rest) == expected


def test_first_refusal_kept_for_a_tuple_follows_the_time_both_ways() -> None:
    """The answer kept for the same tuple of pods holds only from its time on: later, a young pod has
    grown old enough; earlier again, it is young again."""
    pods = (pod("old", "gpu-a-1"), pod("young", "gpu-a-1", age=timedelta(minutes=5)), pod("x", "gpu-a-1"))
    cfgs = (DEFAULT, GuardsConfig(namespaces=NamespaceFilter(exclude=("ml",))))
    for cfg in cfgs:
        for later in (
            timedelta(0),
            timedelta(minutes=6),
            timedelta(hours=2),
            timedelta(0),
            timedelta(minutes=4),
        ):
            snap = snapshot([node("gpu-a-1")], pods, now=NOW + later)
            expected = next(((p, r) for p in pods if (r := pod_refusal(p, snap, cfg)) is not None), None)
            assert guards.first_refusal(pods, snap, cfg) == expected, (later, cfg)


def test_first_refusal_of_a_list_changed_since_is_not_the_answer_kept_for_it() -> None:
    """An answer is kept only for a tuple, which cannot change: a list asked about again after a pod
    was added to it (or a pod replaced) is judged as it is now."""
    snap = snapshot([node("gpu-a-1")], now=NOW)
    excluded = pod("excluded", "gpu-a-1", namespace="kube-system")
    pods = [pod("old", "gpu-a-1")]
    assert guards.first_refusal(pods, snap, DEFAULT) is None
    pods.append(excluded)
    assert guards.first_refusal(pods, snap, DEFAULT) == (excluded, pod_refusal(excluded, snap, DEFAULT))
    pods[1] = pod("other", "gpu-a-1")
    assert guards.first_refusal(pods, snap, DEFAULT) is None


def test_first_refusal_keeps_answers_for_tuples_only() -> None:
    """What is kept holds the pods asked about: a list (or any other sequence but a tuple) is never
    kept, and so never fills what is kept."""
    snap = snapshot([node("gpu-a-1")], now=NOW)
    pods = (pod("old", "gpu-a-1"), pod("x", "gpu-a-1"))
    guards._SETTLED.clear()
    for _ in range(3):
        assert guards.first_refusal(list(pods), snap, DEFAULT) is None
    assert not guards._SETTLED
    assert guards.first_refusal(pods, snap, DEFAULT) is None
    assert [kept[0] for kept in guards._SETTLED.values()] == [pods]


# --------------------------------------------------------------------------- node guard


@pytest.mark.parametrize(
    "key", ["cluster-autoscaler.kubernetes.io/scale-down-disabled", "karpenter.sh/do-not-disrupt"]
)
def test_node_opt_out_annotations(key: str) -> None:
    refusal = node_refusal(node("gpu-a-1", annotations={key: "true"}))
    assert refusal == Refusal("opt-out", f'node gpu-a-1 has annotation {key}: "true"')


def test_a_node_opt_out_annotation_whose_value_is_not_understood_keeps_the_node() -> None:
    key = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
    refusal = node_refusal(node("gpu-a-1", annotations={key: "yes"}))
    assert refusal == Refusal(
        "opt-out",
        f'node gpu-a-1 has annotation {key}: "yes", neither "true" nor "false": held back until it is one',
    )


def test_node_without_opt_out_is_allowed() -> None:
    assert node_refusal(node("gpu-a-1")) is None
    assert node_refusal(node("gpu-a-1", annotations={"karpenter.sh/do-not-disrupt": "false"})) is None


# --------------------------------------------------------------------------- checkpoint requests


def test_the_checkpoint_grant_applies_the_template_in_the_namespace_it_names() -> None:
    from tests.test_deploy import ROOT, TEMPLATE_SUFFIX, kustomization, load_documents

    assert (
        guards.checkpoint_grant("team-a") == "kubectl -n team-a apply -f deploy/checkpoint-rbac.example.yaml"
    )
    template = ROOT / guards.CHECKPOINT_RBAC_TEMPLATE
    assert template.name.endswith(TEMPLATE_SUFFIX) and template.name not in kustomization()["resources"]
    # `-n` decides where it lands: the template names no namespace of its own.
    docs = load_documents(template)
    assert {d["kind"] for d in docs} == {"Role", "RoleBinding"}
    assert all("namespace" not in d["metadata"] for d in docs)
