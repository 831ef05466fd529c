"""deploy/admission-policy.yaml, evaluated: the CEL of each ValidatingAdmissionPolicy runs (cel-python)
against a table of node and pod updates by gpu-rebalancer's ServiceAccount.

- every write the code makes is admitted: the exact JSON patches of KubeTainter (applied by the fake API
  server to nodes of `node_json`), the actuator's checkpoint merge patches, and every write of the
  idle-GPU reclaim (`reclaim.WorkloadWriter`: notify, clear, reclaim by scale, suspend and stop, and
  restore, each applied by the fake API server to the workload);
- each update is judged as the API server hands it to admission, with `metadata.generation` already
  moved on by the kind's strategy (a Deployment's with its annotations, a Job's or JobSet's with
  `spec.suspend`, a pod's with its spec): the fake's registry rules, `set_generation`, for the table too;
- everything else is refused with the message of the rule it breaks: NoExecute taints, someone else's
  taints, labels, spec fields, other annotations, pod specs and labels, pods that did not opt in, a
  workload's image, replicas (outside `scale`), labels, owner references and finalizers (alongside a
  write that moves the generation on, too), the owner's snooze;
- every rule refuses something in the table (none is dead), and the policies apply only to the
  ServiceAccount of deploy/rbac.yaml.

The expressions use standard CEL only (macros all / exists / filter, `has`, `in`, `startsWith`), no
Kubernetes extension library, so cel-python evaluates them as the API server's cel-go does.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError
from kubernetes import client

from rebalancer.actuator import DRAINING_SINCE_ANNOTATION
from rebalancer.guards import (
    CHECKPOINT_ANNOTATION,
    CHECKPOINT_DONE_ANNOTATION,
    EVICTION_REQUESTED_AT_ANNOTATION,
)
from rebalancer.model import Decision, Proposal, ReclaimHow, WorkloadAction, WorkloadVerb
from rebalancer.node_marks import DRAINING_TAINT_KEY, KubeTainter
from rebalancer.reclaim import WorkloadWriter
from rebalancer.workloads import IDLE_SINCE, KINDS, SCALED_DOWN_FROM, SNOOZE_UNTIL
from tests import builders
from tests.fake_apiserver import (
    FakeApiServer,
    controller_json,
    merge_patch,
    node_json,
    pod_json,
    set_generation,
)

ROOT = Path(__file__).resolve().parent.parent
POLICY_FILE = ROOT / "deploy" / "admission-policy.yaml"
RBAC_FILE = ROOT / "deploy" / "rbac.yaml"

Obj = dict[str, Any]


def _service_account_username() -> str:
    (account,) = [
        d for d in yaml.safe_load_all(RBAC_FILE.read_text(encoding="utf-8")) if d["kind"] == "ServiceAccount"
    ]
    return f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}"


USERNAME = _service_account_username()


class CelError(AssertionError):
    """An expression failed to evaluate: the API server would refuse the write (failurePolicy: Fail), but
    for a reason no operator could read, so the table treats it as a broken policy."""


class AdmissionPolicy:
    """One ValidatingAdmissionPolicy of the file, compiled: match conditions, variables, validations."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc = doc
        spec = doc["spec"]
        self._env = celpy.Environment()
        self._conditions = [self._compile(c["expression"]) for c in spec["matchConditions"]]
        self._variables = [(v["name"], self._compile(v["expression"])) for v in spec.get("variables", [])]
        self._validations = [(self._compile(v["expression"]), v["message"]) for v in spec["validations"]]

    @property
    def messages(self) -> set[str]:
        return {message for _, message in self._validations}

    def _compile(self, expression: str) -> Any:
        return self._env.program(self._env.compile(expression))

    @staticmethod
    def _run(program: Any, activation: Mapping[str, Any]) -> Any:
        try:
            return program.evaluate(dict(activation))
        except CELEvalError as exc:
            raise CelError(str(exc)) from exc

    def _activation(self, old: Obj, new: Obj, username: str) -> dict[str, Any]:
        request = {"operation": "UPDATE", "userInfo": {"username": username}}
        return {
            "object": json_to_cel(new),
            "oldObject": json_to_cel(old),
            "request": json_to_cel(request),
        }

    def applies(self, old: Obj, new: Obj, username: str = USERNAME) -> bool:
        activation = self._activation(old, new, username)
        return all(bool(self._run(program, activation)) for program in self._conditions)

    def refusals(self, old: Obj, new: Obj, username: str = USERNAME) -> list[str]:
        """The messages of every validation the update fails; [] when admitted."""
        activation = self._activation(old, new, username)
        if not all(bool(self._run(program, activation)) for program in self._conditions):
            return []
        # Each variable sees the ones before it, as `variables.<name>`.
        variables = celpy.celtypes.MapType({})
        for name, program in self._variables:
            variables[celpy.celtypes.StringType(name)] = self._run(
                program, {**activation, "variables": variables}
            )
        activation["variables"] = variables
        failed = []
        for program, message in self._validations:
            result = self._run(program, activation)
            if not isinstance(result, celpy.celtypes.BoolType):
                raise CelError(f"{message!r}: evaluated to {result!r}, not a bool")
            if not result:
                failed.append(message)
        return failed


def _policies() -> dict[str, AdmissionPolicy]:
    docs = [d for d in yaml.safe_load_all(POLICY_FILE.read_text(encoding="utf-8")) if d]
    return {
        doc["metadata"]["name"]: AdmissionPolicy(doc)
        for doc in docs
        if doc["kind"] == "ValidatingAdmissionPolicy"
    }


POLICIES = _policies()
NODES = POLICIES["gpu-rebalancer-node-changes"]
PODS = POLICIES["gpu-rebalancer-pod-changes"]
WORKLOADS = POLICIES["gpu-rebalancer-workload-changes"]

NODE_SPEC = "gpu-rebalancer may change only rebalancer.gpu/ taints of a node's spec"
NODE_METADATA = "gpu-rebalancer may not change a node's labels"
NODE_TAINTS = "gpu-rebalancer may add, change or remove only rebalancer.gpu/ taints"
NO_EXECUTE = "gpu-rebalancer may not set a NoExecute taint"
NODE_ANNOTATIONS = "gpu-rebalancer may add, change or remove only rebalancer.gpu/ annotations"
POD_SPEC = "gpu-rebalancer may not change a pod's spec"
POD_METADATA = "gpu-rebalancer may not change a pod's labels"
POD_ANNOTATIONS = "gpu-rebalancer may change only the rebalancer.gpu/eviction-requested-at"
NOT_OPTED_IN = "gpu-rebalancer may ask for a checkpoint"
NOT_OUR_ANSWER = "gpu-rebalancer may only remove rebalancer.gpu/checkpoint-done"
WORKLOAD_SPEC = "gpu-rebalancer may change only spec.suspend of a workload"
WORKLOAD_METADATA = "gpu-rebalancer may not change a workload's labels"
WORKLOAD_ANNOTATIONS = "gpu-rebalancer may change only its reclaim record"

OTHER_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
DRAINING = {"key": DRAINING_TAINT_KEY, "value": "cycle-7", "effect": "NoSchedule"}


def _refused_by(policy: AdmissionPolicy, old: Obj, new: Obj) -> list[str]:
    """Which rules (by the start of their message) the update breaks."""
    starts = [
        NODE_SPEC, NODE_METADATA, NODE_TAINTS, NO_EXECUTE, NODE_ANNOTATIONS,
        POD_SPEC, POD_METADATA, POD_ANNOTATIONS, NOT_OPTED_IN, NOT_OUR_ANSWER,
        WORKLOAD_SPEC, WORKLOAD_METADATA, WORKLOAD_ANNOTATIONS,
    ]  # fmt: skip
    refused = policy.refusals(old, new)
    named = [start for start in starts for message in refused if message.startswith(start)]
    assert len(named) == len(refused), f"unnamed refusal among {refused}"
    return named


# --------------------------------------------------------------------------- the policy as deployed


def test_every_policy_fails_closed_and_denies_through_a_binding() -> None:
    docs = [d for d in yaml.safe_load_all(POLICY_FILE.read_text(encoding="utf-8")) if d]
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert len(policies) == 3
    assert sorted(b["spec"]["policyName"] for b in bindings) == sorted(policies)
    for binding in bindings:
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert "matchResources" not in binding["spec"]  # everything the policy matches
    matched: set[tuple[str, str]] = set()
    for policy in policies.values():
        assert policy["spec"]["failurePolicy"] == "Fail"
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]:
            assert rule["operations"] == ["UPDATE"]
            matched |= {(group, resource) for group in rule["apiGroups"] for resource in rule["resources"]}
    # The main resources the service account may patch; status is not ours, scale holds only replicas.
    assert matched == {
        ("", "nodes"),
        ("", "pods"),
        *((kind.group, kind.resource) for kind in KINDS.values() if kind.reclaim is not None),
    }


def test_the_policies_apply_to_the_service_account_only() -> None:
    old = node_json("gpu-1")
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["team"] = "vision"
    assert NODES.applies(old, new)
    assert NODES.refusals(old, new) != []
    for someone_else in ("system:node:gpu-1", "system:serviceaccount:kube-system:node-controller", "admin"):
        assert not NODES.applies(old, new, someone_else)
        assert NODES.refusals(old, new, someone_else) == []
        assert not PODS.applies(old, new, someone_else)


# --------------------------------------------------------------------------- nodes: what KubeTainter sends


def _node_change(api: FakeApiServer, name: str, change: Callable[[], object]) -> tuple[Obj, Obj]:
    before = copy.deepcopy(api.node(name))
    change()
    after = api.node(name)
    assert before is not None and after is not None
    assert before != after, "the change made no write: the case tests nothing"
    return before, copy.deepcopy(after)


@pytest.mark.parametrize("taints", [(), (OTHER_TAINT,)], ids=["untainted", "with-another-taint"])
@pytest.mark.parametrize("effect", ["NoSchedule", "PreferNoSchedule"])
def test_every_node_write_of_the_tainter_is_admitted(
    api: FakeApiServer, api_client: client.ApiClient, taints: tuple[Obj, ...], effect: str
) -> None:
    api.add(node_json("gpu-1", taints=taints, labels={"team": "vision"}))
    tainter = KubeTainter(api_client, effect=effect)
    since = {DRAINING_SINCE_ANNOTATION: "2026-11-30T12:00:00Z"}
    writes = [
        lambda: tainter.taint("gpu-1", "cycle-7", annotations=since),  # mark, with its annotation
        lambda: tainter.taint("gpu-1", "cycle-8"),  # taken over by another plan: the value changes
        lambda: tainter.taint(
            "gpu-1", "cycle-8", annotations={DRAINING_SINCE_ANNOTATION: "2026-11-30T13:00:00Z"}
        ),
        lambda: tainter.untaint("gpu-1", remove_annotations=[DRAINING_SINCE_ANNOTATION]),
    ]
    for write in writes:
        old, new = _node_change(api, "gpu-1", write)
        assert NODES.refusals(old, new) == []
    final = api.node("gpu-1")
    assert final is not None and final["spec"].get("taints", []) == list(taints)


def test_a_node_without_a_spec_can_be_marked(api: FakeApiServer, api_client: client.ApiClient) -> None:
    node = node_json("gpu-1")
    del node["spec"]
    api.add(node)
    old, new = _node_change(api, "gpu-1", lambda: KubeTainter(api_client).taint("gpu-1", "c"))
    assert "spec" not in old
    assert NODES.refusals(old, new) == []


# --------------------------------------------------------------------------- nodes: the table


def _node(**changes: Any) -> Obj:
    node = node_json("gpu-1", taints=[OTHER_TAINT], labels={"team": "vision"})
    node["metadata"]["annotations"] = {"node.alpha.kubernetes.io/ttl": "0"}
    node["metadata"]["resourceVersion"] = "41"
    node["spec"].update(providerID="aws:///us-east-1a/i-0abc", podCIDR="10.0.3.0/24")
    for key, value in changes.items():
        node["spec"][key] = value
    return node


def _edit(obj: Obj, edit: Callable[[Obj], object]) -> Obj:
    """`obj` changed by `edit`, as the API server hands the update to admission: its bookkeeping moved
    on, and `metadata.generation` as the kind's strategy sets it (the fake's registry rules: a
    Deployment's moves on with its spec or annotations, a Job's or JobSet's with its spec)."""
    new = copy.deepcopy(obj)
    new["metadata"]["resourceVersion"] = "42"
    new["metadata"]["managedFields"] = [{"manager": "gpu-rebalancer", "operation": "Update"}]
    edit(new)
    set_generation(obj, new)
    return new


def _add_taint(taint: Obj) -> Callable[[Obj], object]:
    return lambda n: n["spec"].setdefault("taints", []).append(taint)


def _annotate(key: str, value: str | None) -> Callable[[Obj], object]:
    def edit(obj: Obj) -> None:
        notes = obj["metadata"].setdefault("annotations", {})
        if value is None:
            notes.pop(key, None)
        else:
            notes[key] = value

    return edit


NODE_CASES: dict[str, tuple[Obj, Callable[[Obj], object], list[str]]] = {
    # admitted
    "add our NoSchedule taint": (_node(), _add_taint(DRAINING), []),
    "remove our taint": (_node(taints=[OTHER_TAINT, DRAINING]), lambda n: n["spec"]["taints"].pop(), []),
    "add our annotation": (_node(), _annotate(DRAINING_SINCE_ANNOTATION, "2026-11-30T12:00:00Z"), []),
    "another rebalancer.gpu/ annotation": (_node(), _annotate("rebalancer.gpu/note", "x"), []),
    "remove our annotation": (
        _edit(_node(), _annotate(DRAINING_SINCE_ANNOTATION, "2026-11-30T12:00:00Z")),
        _annotate(DRAINING_SINCE_ANNOTATION, None),
        [],
    ),
    "keep someone's rebalancer.gpu/ NoExecute taint": (
        _node(taints=[OTHER_TAINT, {"key": "rebalancer.gpu/quarantine", "effect": "NoExecute"}]),
        _add_taint(DRAINING),
        [],
    ),
    "nothing changes but the bookkeeping": (_node(), lambda n: None, []),
    # refused
    "add our taint as NoExecute": (_node(), _add_taint({**DRAINING, "effect": "NoExecute"}), [NO_EXECUTE]),
    "turn our taint into NoExecute": (
        _node(taints=[OTHER_TAINT, DRAINING]),
        lambda n: n["spec"]["taints"][1].update(effect="NoExecute"),
        [NO_EXECUTE],
    ),
    "add another NoExecute taint": (
        _node(),
        _add_taint({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}),
        [NODE_TAINTS],
    ),
    "add another taint": (
        _node(),
        _add_taint({"key": "team", "value": "x", "effect": "NoSchedule"}),
        [NODE_TAINTS],
    ),
    "remove someone else's taint": (_node(), lambda n: n["spec"].pop("taints"), [NODE_TAINTS]),
    "change someone else's taint": (
        _node(),
        lambda n: n["spec"]["taints"][0].update(value="no"),
        [NODE_TAINTS],
    ),
    "change a label": (_node(), lambda n: n["metadata"]["labels"].update(team="nlp"), [NODE_METADATA]),
    "add a label": (_node(), lambda n: n["metadata"]["labels"].update(drain="yes"), [NODE_METADATA]),
    "remove a label": (_node(), lambda n: n["metadata"]["labels"].pop("team"), [NODE_METADATA]),
    "add a finalizer": (_node(), lambda n: n["metadata"].update(finalizers=["x/y"]), [NODE_METADATA]),
    "cordon (spec.unschedulable)": (_node(), lambda n: n["spec"].update(unschedulable=True), [NODE_SPEC]),
    "uncordon": (_node(unschedulable=True), lambda n: n["spec"].pop("unschedulable"), [NODE_SPEC]),
    "change providerID": (_node(), lambda n: n["spec"].update(providerID="aws:///x/i-1"), [NODE_SPEC]),
    "change podCIDR": (_node(), lambda n: n["spec"].update(podCIDR="10.9.0.0/24"), [NODE_SPEC]),
    "change status": (_node(), lambda n: n["status"]["allocatable"].update(cpu="1"), [NODE_SPEC]),
    "change another annotation": (
        _node(),
        _annotate("node.alpha.kubernetes.io/ttl", "30"),
        [NODE_ANNOTATIONS],
    ),
    "add another annotation": (
        _node(),
        _annotate("cluster-autoscaler.kubernetes.io/scale-down-disabled", "true"),
        [NODE_ANNOTATIONS],
    ),
    "remove another annotation": (_node(), lambda n: n["metadata"].pop("annotations"), [NODE_ANNOTATIONS]),
}


@pytest.mark.parametrize(("old", "edit", "refused"), NODE_CASES.values(), ids=NODE_CASES.keys())
def test_node_updates(old: Obj, edit: Callable[[Obj], object], refused: list[str]) -> None:
    assert _refused_by(NODES, old, _edit(old, edit)) == refused


# --------------------------------------------------------------------------- pods


def _pod(annotations: Mapping[str, str] | None = None) -> Obj:
    pod = pod_json("trainer-0", "gpu-1", annotations=annotations or None)
    pod["metadata"]["resourceVersion"] = "41"
    pod["metadata"]["generation"] = 1  # the API server's (1.33+): a change of the spec moves it on
    return pod


OPTED_IN = {CHECKPOINT_ANNOTATION: "true"}
ASKED = {**OPTED_IN, EVICTION_REQUESTED_AT_ANNOTATION: "2026-11-30T12:00:00Z"}
ANSWERED = {**ASKED, CHECKPOINT_DONE_ANNOTATION: "true"}


def _actuator_patch(annotations: Mapping[str, str | None]) -> Callable[[Obj], object]:
    """The actuator's checkpoint write: a merge patch of the pod's uid and annotations (None removes)."""

    def edit(pod: Obj) -> None:
        body = {"metadata": {"uid": pod["metadata"]["uid"], "annotations": dict(annotations)}}
        pod.update(merge_patch(pod, body))

    return edit


ASK = _actuator_patch(
    {EVICTION_REQUESTED_AT_ANNOTATION: "2026-11-30T13:00:00Z", CHECKPOINT_DONE_ANNOTATION: None}
)
WITHDRAW = _actuator_patch({EVICTION_REQUESTED_AT_ANNOTATION: None, CHECKPOINT_DONE_ANNOTATION: None})


def _set_image(pod: Obj) -> None:
    pod["spec"]["containers"][0]["image"] = "evil:latest"


POD_CASES: dict[str, tuple[Obj, Callable[[Obj], object], list[str]]] = {
    # admitted
    "ask an opted-in pod": (_pod(OPTED_IN), ASK, []),
    "ask again, clearing the old answer": (_pod(ANSWERED), ASK, []),
    "withdraw a request": (_pod(ANSWERED), WITHDRAW, []),
    "withdraw from a pod that opted out since": (
        _pod({EVICTION_REQUESTED_AT_ANNOTATION: "2026-11-30T12:00:00Z", CHECKPOINT_DONE_ANNOTATION: "true"}),
        WITHDRAW,
        [],
    ),
    # refused
    "ask a pod that did not opt in": (_pod(), ASK, [NOT_OPTED_IN]),
    "ask a pod that opted out": (_pod({CHECKPOINT_ANNOTATION: "false"}), ASK, [NOT_OPTED_IN]),
    "opt a pod in": (
        _pod(),
        _actuator_patch({CHECKPOINT_ANNOTATION: "true", EVICTION_REQUESTED_AT_ANNOTATION: "now"}),
        [POD_ANNOTATIONS, NOT_OPTED_IN],
    ),
    "answer for the pod": (
        _pod(ASKED),
        _actuator_patch({CHECKPOINT_DONE_ANNOTATION: "true"}),
        [NOT_OUR_ANSWER],
    ),
    "change the image": (_pod(ASKED), _set_image, [POD_SPEC]),
    "change the status": (_pod(ASKED), lambda p: p["status"].update(phase="Failed"), [POD_SPEC]),
    "change a label": (_pod(ASKED), lambda p: p["metadata"]["labels"].update(app="x"), [POD_METADATA]),
    "change the owner": (_pod(ASKED), lambda p: p["metadata"].pop("ownerReferences"), [POD_METADATA]),
    "change another annotation": (
        _pod(ASKED),
        _actuator_patch({"rebalancer.gpu/evict": "false"}),
        [POD_ANNOTATIONS],
    ),
    "remove the opt-in": (_pod(ASKED), _actuator_patch({CHECKPOINT_ANNOTATION: None}), [POD_ANNOTATIONS]),
}


@pytest.mark.parametrize(("old", "edit", "refused"), POD_CASES.values(), ids=POD_CASES.keys())
def test_pod_updates(old: Obj, edit: Callable[[Obj], object], refused: list[str]) -> None:
    assert _refused_by(PODS, old, _edit(old, edit)) == refused


# --------------------------------------------------------------------------- workloads


def _workload_change(
    api: FakeApiServer, kind: str, api_version: str, write: Callable[[], object]
) -> tuple[Obj, Obj]:
    """The workload before and after `write`, as the policy sees the writes to its main resource: a
    replicas change made through the `scale` subresource is not one of them (the policy does not match
    `scale`), so it is taken out of the comparison, and only when the write did go through `scale`; so is
    the move of `metadata.generation` it made (the fake's registry moves it on once for a change of the
    replicas, as the kind's strategy does), leaving the one the main resource's write made."""
    api.clear_requests()
    before = copy.deepcopy(api.get(kind, "top", "ml", api_version))
    write()
    after = api.get(kind, "top", "ml", api_version)
    assert before is not None and after is not None
    seen = copy.deepcopy(after)
    if api.requests_to("*/top/scale", "PATCH"):
        assert not api.requests_to("*/top", "PUT")
        assert len(api.requests_to("*/top/scale", "PATCH")) == 1
        if seen["spec"]["replicas"] != before["spec"]["replicas"]:
            seen["metadata"]["generation"] -= 1
        seen["spec"]["replicas"] = before["spec"]["replicas"]
    return before, seen


def _reclaim(how: ReclaimHow, verb: WorkloadVerb, kind: str) -> Decision:
    pod = builders.pod("w-0", "gpu-1")
    action = WorkloadAction(
        verb=verb, workload=("ml", kind, "top"), controller=None, how=how if verb == "reclaim" else None
    )
    proposal = Proposal(strategy="idle-gpu", kind="workload", pods=(pod,), reason="idle", action=action)
    return Decision(proposal=proposal, approved=True)


@pytest.mark.parametrize(
    ("kind", "api_version", "how"),
    [
        ("Deployment", "apps/v1", "scale"),
        ("StatefulSet", "apps/v1", "scale"),
        ("Job", "batch/v1", "suspend"),
        ("JobSet", "jobset.x-k8s.io/v1alpha2", "suspend"),
        ("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1", "scale"),
        ("Notebook", "kubeflow.org/v1", "stop"),
    ],
)
def test_every_workload_write_of_the_reclaim_is_admitted(
    api: FakeApiServer, api_client: client.ApiClient, kind: str, api_version: str, how: ReclaimHow
) -> None:
    scalable = how == "scale"
    api.add(
        controller_json(
            kind, "top", annotations={SNOOZE_UNTIL: "2026-01-01T00:00:00Z"}, replicas=2 if scalable else None
        )
    )
    writer = WorkloadWriter(api_client)
    writes = [
        lambda: writer.apply(_reclaim(how, "notify", kind), builders.NOW),
        lambda: writer.apply(_reclaim(how, "clear", kind), builders.NOW),
        lambda: writer.apply(_reclaim(how, "notify", kind), builders.NOW),
        lambda: writer.apply(_reclaim(how, "reclaim", kind), builders.NOW),
        lambda: writer.restore("ml", kind, "top"),
    ]
    for write in writes:
        old, new = _workload_change(api, kind, api_version, write)
        assert old != new, "the write changed nothing: the case tests nothing"
        assert WORKLOADS.refusals(old, new) == []
    final = api.get(kind, "top", "ml", api_version)
    assert final is not None and final["metadata"]["annotations"] == {SNOOZE_UNTIL: "2026-01-01T00:00:00Z"}


def _deployment(annotations: Mapping[str, str] | None = None) -> Obj:
    return _workload("Deployment", replicas=2, annotations=annotations)


def _workload(kind: str, **fields: Any) -> Obj:
    workload = controller_json(kind, "top", **fields)
    workload["metadata"]["resourceVersion"] = "41"
    return workload


def _merge_annotations(changes: Mapping[str, str | None]) -> Callable[[Obj], object]:
    def edit(obj: Obj) -> None:
        obj.update(merge_patch(obj, {"metadata": {"annotations": dict(changes)}}))

    return edit


def _set_template_image(obj: Obj) -> None:
    obj["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"


def _suspend(obj: Obj) -> None:
    obj["spec"]["suspend"] = True


def _set_label(obj: Obj) -> None:
    obj["metadata"]["labels"]["app"] = "x"


def _set_owner(obj: Obj) -> None:
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"}]


def _add_finalizer(obj: Obj) -> None:
    obj["metadata"]["finalizers"] = ["x/y"]


def _all(*edits: Callable[[Obj], object]) -> Callable[[Obj], object]:
    """One update making every edit."""

    def edit(obj: Obj) -> None:
        for each in edits:
            each(obj)

    return edit


# Every update as the API server hands it to admission (`_edit`): a Deployment's generation has moved on
# when its annotations changed, a Job's or JobSet's when its spec did.
WORKLOAD_CASES: dict[str, tuple[Obj, Callable[[Obj], object], list[str]]] = {
    "tell a Deployment's owner": (_deployment(), _merge_annotations({IDLE_SINCE: "t"}), []),
    "record a reclaim": (
        _deployment({IDLE_SINCE: "t"}),
        _merge_annotations({IDLE_SINCE: None, SCALED_DOWN_FROM: "2"}),
        [],
    ),
    "suspend": (_deployment(), _suspend, []),
    "suspend a Job": (_workload("Job", suspend=False), _suspend, []),
    "suspend a JobSet": (_workload("JobSet", suspend=False), _suspend, []),
    "resume a Job": (_workload("Job", suspend=True), lambda j: j["spec"].update(suspend=False), []),
    "change the image": (_deployment(), _set_template_image, [WORKLOAD_SPEC]),
    "change a Job's image as it suspends it": (
        _workload("Job", suspend=False),
        _all(_suspend, _set_template_image),
        [WORKLOAD_SPEC],
    ),
    "scale through the main resource": (
        _deployment(),
        lambda d: d["spec"].update(replicas=0),
        [WORKLOAD_SPEC],
    ),
    "change a label": (_deployment(), _set_label, [WORKLOAD_METADATA]),
    "change a label with the idle mark": (
        _deployment(),
        _all(_merge_annotations({IDLE_SINCE: "t"}), _set_label),
        [WORKLOAD_METADATA],
    ),
    "change a Job's label as it suspends it": (
        _workload("Job", suspend=False),
        _all(_suspend, _set_label),
        [WORKLOAD_METADATA],
    ),
    "change the owner as it suspends": (
        _workload("JobSet", suspend=False),
        _all(_suspend, _set_owner),
        [WORKLOAD_METADATA],
    ),
    "add a finalizer with the idle mark": (
        _deployment(),
        _all(_merge_annotations({IDLE_SINCE: "t"}), _add_finalizer),
        [WORKLOAD_METADATA],
    ),
    "snooze for the owner": (
        _deployment({IDLE_SINCE: "t"}),
        _merge_annotations({SNOOZE_UNTIL: "2099-01-01T00:00:00Z"}),
        [WORKLOAD_ANNOTATIONS],
    ),
    "remove the owner's snooze": (
        _deployment({SNOOZE_UNTIL: "2099-01-01T00:00:00Z"}),
        _merge_annotations({SNOOZE_UNTIL: None}),
        [WORKLOAD_ANNOTATIONS],
    ),
}


def test_the_table_sees_the_generation_the_api_server_moves_on() -> None:
    for case in ("tell a Deployment's owner", "record a reclaim", "suspend a Job", "suspend a JobSet"):
        old, edit, _ = WORKLOAD_CASES[case]
        assert _edit(old, edit)["metadata"]["generation"] == old["metadata"]["generation"] + 1, case
    old, edit, _ = POD_CASES["change the image"]
    assert _edit(old, edit)["metadata"]["generation"] == old["metadata"]["generation"] + 1


@pytest.mark.parametrize(("old", "edit", "refused"), WORKLOAD_CASES.values(), ids=WORKLOAD_CASES.keys())
def test_workload_updates(old: Obj, edit: Callable[[Obj], object], refused: list[str]) -> None:
    assert _refused_by(WORKLOADS, old, _edit(old, edit)) == refused


# --------------------------------------------------------------------------- no dead rule


def test_every_rule_refuses_something_in_the_table() -> None:
    for policy, cases in ((NODES, NODE_CASES), (PODS, POD_CASES), (WORKLOADS, WORKLOAD_CASES)):
        exercised = {start for _, _, refused in cases.values() for start in refused}
        named = {start for message in policy.messages for start in exercised if message.startswith(start)}
        assert len(named) == len(policy.messages) == len(exercised), (
            policy.doc["metadata"]["name"],
            exercised,
        )
