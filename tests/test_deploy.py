"""The in-cluster install (deploy/) and the container image (Dockerfile): they must apply, agree with
each other and with the code they run.

- every manifest validates offline against a current Kubernetes schema in strict mode (unknown
  fields are errors); kinds without a schema there (Prometheus Operator CRDs) are checked by
  tests/test_deploy_monitoring.py;
- the kustomization lists exactly the manifests (templates excepted) and builds, alone and with each
  of its optional components (the Prometheus Operator's objects, the CronJob of `rebalancer once`);
- the image's tag is the project's version, named once in deploy/ and never in the Dockerfile;
- the policy ConfigMap is policies/default.yaml verbatim and valid;
- the Deployment is dry-run first, least privilege, probed, and wired to the policy, the image and
  the Secret template;
- the packed scheduler runs the MostAllocated profile the consolidation strategy assumes, with the
  weights of the placement simulation;
- the NetworkPolicy selects exactly the descheduler's pods: in, only its http port; out, only DNS, the
  API server, Prometheus and HTTPS;
- the admission policies bind to the ServiceAccount (their CEL is evaluated in
  tests/test_admission_policy.py); the image itself is checked in tests/test_image.py.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kubernetes_validate  # type: ignore[import-untyped]

from rebalancer import cli as rebalancer_cli
from rebalancer import scoring
from rebalancer.cli import main as rebalancer_main
from rebalancer.node_accounting import PROFILE_PREFERENCES
from rebalancer.policy import GangConfig, GpuSharingConfig, loads_policy
from rebalancer.sources.kube_pods import pod_from_json
from strategies.gpu_consolidation import GpuConsolidationArgs
from tests.dockerfile import (
    DOCKERFILE,
    dockerfile_args,
    dockerfile_instruction,
    dockerfile_lines,
    dockerfile_user,
)

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPONENTS = DEPLOY / "components"
# Optional parts of the install, off in the base (deploy/kustomization.yaml lists them commented out).
OPTIONAL_COMPONENTS = ("prometheus-operator", "cronjob")
NAMESPACE = "gpu-rebalancer"
# Files in deploy/ that are templates for the operator to copy: never applied by the kustomization
# (a re-apply would overwrite the real values with placeholders).
TEMPLATE_SUFFIX = ".example.yaml"
# Kinds that kubernetes-validate has no schema for; their own tests check their required fields.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
# The newest Kubernetes the installed kubernetes-validate knows; it must be a current one.
KUBERNETES_VERSION = kubernetes_validate.latest_version()
OLDEST_CURRENT_KUBERNETES = (1, 33)

Manifest = dict[str, Any]


# --------------------------------------------------------------------------- loading


def manifest_files() -> list[Path]:
    """The manifests of the base, deploy/ (top level), templates included, the kustomization excluded."""
    return sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")


def component_files(component: str | None = None) -> list[Path]:
    """The manifests of deploy/components/ (of one component, or all), their kustomizations excluded."""
    root = COMPONENTS / component if component else COMPONENTS
    return sorted(p for p in root.rglob("*.yaml") if p.name != "kustomization.yaml")


def load_documents(path: Path) -> list[Manifest]:
    docs = [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]
    for doc in docs:
        assert isinstance(doc, dict), f"{path.name}: every document must be a mapping"
    return docs


def all_objects(*, templates: bool = False, components: bool = True) -> list[tuple[Path, Manifest]]:
    """Every object of deploy/: the base's and (unless `components` is False) the components'."""
    files = manifest_files() + (component_files() if components else [])
    return [
        (path, doc)
        for path in files
        if templates or not path.name.endswith(TEMPLATE_SUFFIX)
        for doc in load_documents(path)
    ]


def find(kind: str, name: str, *, templates: bool = False) -> Manifest:
    matches = [
        doc
        for _, doc in all_objects(templates=templates)
        if doc["kind"] == kind and doc["metadata"]["name"] == name
    ]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def container(deployment: Manifest) -> Manifest:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: Manifest = containers[0]
    return result


def kustomization() -> Manifest:
    data: Manifest = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text(encoding="utf-8"))
    return data


def project_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        version: str = tomllib.load(handle)["project"]["version"]
    return version


def labels_match(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def _object_id(path: Path, doc: Manifest) -> str:
    return f"{path.name}:{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def _ids(objects: list[tuple[Path, Manifest]]) -> list[str]:
    return [_object_id(path, doc) for path, doc in objects]


# --------------------------------------------------------------------------- schema validation

_SCHEMA_CHECKED = [
    (p, d) for p, d in all_objects(templates=True) if (d["apiVersion"], d["kind"]) not in CUSTOM_KINDS
]


def test_the_kubernetes_version_validated_against_is_current() -> None:
    major, minor = (int(part) for part in KUBERNETES_VERSION.split(".")[:2])
    assert (major, minor) >= OLDEST_CURRENT_KUBERNETES


@pytest.mark.parametrize(("path", "doc"), _SCHEMA_CHECKED, ids=_ids(_SCHEMA_CHECKED))
def test_every_manifest_validates_strictly(path: Path, doc: Manifest) -> None:
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(part) for part in exc.path)
        pytest.fail(f"{_object_id(path, doc)} is invalid at {where}: {exc.message}", pytrace=False)


def test_strict_validation_rejects_what_the_api_server_would() -> None:
    """The check above is real: a misspelt field or a wrong type fails it."""
    deployment = find("Deployment", "gpu-rebalancer")
    misspelt = copy.deepcopy(deployment)
    misspelt["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz"}}
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "two"
    for bad in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_only_known_custom_kinds_skip_schema_validation() -> None:
    kinds = {(d["apiVersion"], d["kind"]) for _, d in all_objects(templates=True)}
    for api_version, kind in kinds - CUSTOM_KINDS:
        doc = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}}
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(f"no schema for {api_version} {kind}: it would go unchecked", pytrace=False)
        except kubernetes_validate.ValidationError:
            pass  # a schema exists (the stub is incomplete, which is fine here)


# --------------------------------------------------------------------------- kustomization


def test_the_kustomization_lists_every_manifest_and_nothing_else() -> None:
    resources = kustomization()["resources"]
    assert len(resources) == len(set(resources)), "a resource is listed twice"
    listed = set(resources)
    for name in listed:
        assert (DEPLOY / name).is_file(), f"kustomization.yaml lists {name}, which does not exist"
    manifests = {p.name for p in manifest_files()}
    templates = {name for name in manifests if name.endswith(TEMPLATE_SUFFIX)}
    assert templates, "the Secret template is missing"
    unlisted, listed_templates = sorted(manifests - templates - listed), sorted(listed & templates)
    assert listed == manifests - templates, f"not listed: {unlisted}; templates listed: {listed_templates}"


def test_the_kustomization_does_not_rewrite_namespaces() -> None:
    """A `namespace:` transformer would also move the kube-system RoleBinding of the scheduler."""
    assert "namespace" not in kustomization()


def test_namespaced_objects_live_in_the_namespace() -> None:
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "PriorityClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for path, doc in all_objects(templates=True):
        where = _object_id(path, doc)
        namespace = doc["metadata"].get("namespace")
        if doc["kind"] in cluster_scoped:
            assert namespace is None, f"{where} is cluster-scoped"
        elif (doc["kind"], doc["metadata"]["name"]) == (
            "RoleBinding",
            "gpu-packed-scheduler-authentication-reader",
        ):
            assert namespace == "kube-system"  # the Role it binds lives there
        elif path.name in ("checkpoint-rbac.example.yaml", "reclaim-rbac.example.yaml"):
            assert namespace is None, f"{where} is applied with -n <team namespace>: it names none"
        else:
            assert namespace == NAMESPACE, f"{where} must be in {NAMESPACE}"
    assert find("Namespace", NAMESPACE)


def _kinds(objects: list[Manifest]) -> list[tuple[str, str, str]]:
    return sorted((d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]) for d in objects)


def kustomize_build(root: Path) -> list[Manifest]:
    """`kubectl kustomize root` (kustomize built into kubectl), as objects."""
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    built = subprocess.run(
        [kubectl, "kustomize", str(root)], capture_output=True, text=True, check=False, timeout=60
    )
    assert built.returncode == 0, built.stderr
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


def images_of(objects: list[Manifest], name: str) -> set[str]:
    """The images of every container of every pod template in `objects` named `name`."""
    found = set()
    for doc in objects:
        if doc["metadata"]["name"] != name:
            continue
        spec = doc.get("spec", {})
        template = spec.get("jobTemplate", {}).get("spec", spec).get("template")
        if template:
            found |= {c["image"] for c in template["spec"]["containers"]}
    return found


def with_components(tmp_path: Path, *components: str) -> Path:
    """A kustomization of an operator's own: deploy/ as its resource, plus `components`."""
    root = tmp_path / "my-install"
    root.mkdir()
    base = Path(os.path.relpath(DEPLOY, root))  # kustomize takes relative paths only
    (root / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [str(base)],
                "components": [str(base / "components" / c) for c in components],
            }
        ),
        encoding="utf-8",
    )
    return root


_NEEDS_KUBECTL = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (with its built-in kustomize) is not installed"
)


@_NEEDS_KUBECTL
def test_kustomize_builds_every_object_once() -> None:
    objects = kustomize_build(DEPLOY)
    assert _kinds(objects) == _kinds([d for _, d in all_objects(components=False)])
    # Only Kubernetes' own kinds: `kubectl apply -k deploy/` works on a cluster without extra CRDs.
    assert not {(d["apiVersion"], d["kind"]) for d in objects} & CUSTOM_KINDS
    assert images_of(objects, NAMESPACE) == {f"gpu-rebalancer:{project_version()}"}


@_NEEDS_KUBECTL
def test_the_prometheus_operator_component_adds_its_objects(tmp_path: Path) -> None:
    objects = kustomize_build(with_components(tmp_path, "prometheus-operator"))
    added = [d for _, d in all_objects(components=False)] + [
        doc for path in component_files("prometheus-operator") for doc in load_documents(path)
    ]
    assert _kinds(objects) == _kinds(added)
    assert {(d["apiVersion"], d["kind"]) for d in objects} & CUSTOM_KINDS == CUSTOM_KINDS


@_NEEDS_KUBECTL
def test_the_cronjob_component_swaps_the_daemon_for_a_cronjob(tmp_path: Path) -> None:
    objects = kustomize_build(with_components(tmp_path, "cronjob"))
    kinds = {(d["kind"], d["metadata"]["name"]) for d in objects}
    assert ("CronJob", NAMESPACE) in kinds
    # The daemon, its budget and its /metrics Service go; the packed scheduler stays.
    assert not {("Deployment", NAMESPACE), ("PodDisruptionBudget", NAMESPACE), ("Service", NAMESPACE)} & kinds
    assert ("Deployment", "gpu-packed-scheduler") in kinds
    assert images_of(objects, NAMESPACE) == {f"gpu-rebalancer:{project_version()}"}


@_NEEDS_KUBECTL
def test_the_components_can_be_enabled_in_the_base_by_uncommenting_them(tmp_path: Path) -> None:
    copy_of_deploy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy_of_deploy)
    kustomization_file = copy_of_deploy / "kustomization.yaml"
    text = kustomization_file.read_text(encoding="utf-8")
    for component in OPTIONAL_COMPONENTS:
        commented = f"  # - components/{component}\n"
        assert commented in text, f"deploy/kustomization.yaml does not offer components/{component}"
        text = text.replace(commented, f"  - components/{component}\n")
    kustomization_file.write_text(text, encoding="utf-8")
    kinds = {d["kind"] for d in kustomize_build(copy_of_deploy)}
    assert {"CronJob", "ServiceMonitor", "PrometheusRule"} <= kinds


def test_each_component_lists_exactly_its_manifests() -> None:
    for root in sorted(p for p in COMPONENTS.iterdir() if p.is_dir()):
        data = yaml.safe_load((root / "kustomization.yaml").read_text(encoding="utf-8"))
        assert data["kind"] == "Component" and data["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
        assert sorted(data.get("resources", [])) == sorted(p.name for p in component_files(root.name)), root
    assert sorted(p.name for p in COMPONENTS.iterdir()) == sorted(("image", *OPTIONAL_COMPONENTS))
    assert kustomization()["components"] == ["components/image"]


# --------------------------------------------------------------------------- policy


def policy_text() -> str:
    text: str = find("ConfigMap", "gpu-rebalancer-policy")["data"]["policy.yaml"]
    return text


def test_the_policy_configmap_is_the_default_policy_verbatim() -> None:
    assert policy_text() == (ROOT / "policies" / "default.yaml").read_text(encoding="utf-8")


def uncommented(text: str, key: str) -> str:
    """`text` with its commented-out `# key:` block (and the comment lines indented under it) as YAML."""
    lines, out, inside = text.splitlines(), [], ""
    for line in lines:
        if (found := re.match(rf"^(\s*)# {re.escape(key)}:\s*$", line)) is not None:
            inside = found[1]
            out.append(f"{inside}{key}:")
            continue
        if inside and line.startswith(f"{inside}#   "):
            out.append(inside + line[len(inside) + 2 :])
            continue
        inside = ""
        out.append(line)
    return "\n".join(out) + "\n"


def test_the_shipped_prometheus_example_is_a_valid_policy_once_uncommented() -> None:
    # An operator uncomments it in the ConfigMap: it must load, as the daemon (no extra flag) runs it.
    text = uncommented(policy_text(), "prometheus")
    assert text != policy_text()
    loaded = loads_policy(text, "deploy/policy-configmap.yaml")
    assert loaded.policy.telemetry is not None and loaded.policy.telemetry.prometheus is not None
    assert loaded.policy.telemetry.prometheus.url == "http://prometheus-operated.monitoring.svc:9090"


def test_the_policy_configmap_is_valid_and_dry_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = loads_policy(policy_text(), "deploy/policy-configmap.yaml")
    assert loaded.policy.dry_run is True
    assert {s.name for s in loaded.strategies} == {
        "gpu-affinity",
        "idle-gpu",
        "topology-spread",
        "gpu-consolidation",
    }
    # ... and the command an operator runs agrees.
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text(), encoding="utf-8")
    assert rebalancer_main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: valid"


# --------------------------------------------------------------------------- the descheduler Deployment


def rebalancer_deployment() -> Manifest:
    return find("Deployment", "gpu-rebalancer")


def test_the_deployment_runs_two_replicas_in_dry_run_first() -> None:
    deployment = rebalancer_deployment()
    assert deployment["spec"]["replicas"] == 2
    args = container(deployment)["args"]
    assert args[:3] == ["run", "--policy", "/etc/gpu-rebalancer/policy.yaml"]
    assert args.count("--dry-run") == 1
    # Going live is a one-line change, spelt out right above that line.
    text = (DEPLOY / "deployment.yaml").read_text(encoding="utf-8").splitlines()
    flag = text.index("            - --dry-run")
    comment = " ".join(line.strip().removeprefix("# ") for line in text[flag - 3 : flag])
    assert "To go live, change the next line to `- --no-dry-run`" in comment


def _run_parser() -> argparse.ArgumentParser:
    """The parser of `rebalancer run`: the CLI's once it has the subcommand, else the daemon's options."""
    from rebalancer import cli
    from rebalancer.daemon.args import add_run_arguments

    parser = cli.build_parser()
    subcommands = next((a.choices for a in parser._actions if isinstance(a.choices, dict)), {})
    if "run" in subcommands:
        return parser
    standalone = argparse.ArgumentParser(prog="rebalancer")
    sub = standalone.add_subparsers(dest="command", required=True)
    add_run_arguments(sub.add_parser("run"))
    return standalone


def rebalancer_cronjob() -> Manifest:
    return find("CronJob", "gpu-rebalancer")


def rebalancer_cronjob_pod() -> Manifest:
    """The CronJob's pod template (what `container()` reads of a Deployment)."""
    template: Manifest = rebalancer_cronjob()["spec"]["jobTemplate"]
    return template


def test_the_cronjob_runs_one_cycle_at_a_time_in_dry_run() -> None:
    cronjob = rebalancer_cronjob()
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"  # no leader election: never two at once
    args = container(rebalancer_cronjob_pod())["args"]
    assert args[:3] == ["once", "--policy", "/etc/gpu-rebalancer/policy.yaml"]
    parsed = rebalancer_cli.build_parser().parse_args(args)
    assert parsed.command == "once" and parsed.snapshot is None and parsed.dry_run is True
    live = rebalancer_cli.build_parser().parse_args(
        [("--no-dry-run" if a == "--dry-run" else a) for a in args]
    )
    assert live.dry_run is False
    text = (COMPONENTS / "cronjob" / "cronjob.yaml").read_text(encoding="utf-8").splitlines()
    flag = text.index("                - --dry-run")
    comment = " ".join(line.strip().removeprefix("# ") for line in text[flag - 2 : flag])
    assert "To act, change the next line to `- --no-dry-run`" in comment


def test_the_cronjob_pod_is_the_daemon_pod_without_the_server() -> None:
    """Same account, priority, security, policy mount and labels (the NetworkPolicy's egress) as the
    daemon; no ports or probes: `once` serves nothing."""
    daemon_pod = rebalancer_deployment()["spec"]["template"]
    job_pod = rebalancer_cronjob_pod()["spec"]["template"]
    assert job_pod["metadata"]["labels"] == daemon_pod["metadata"]["labels"]
    for key in ("serviceAccountName", "priorityClassName", "securityContext", "volumes"):
        assert job_pod["spec"][key] == daemon_pod["spec"][key], key
    assert job_pod["spec"]["restartPolicy"] == "Never"
    daemon, job = container(rebalancer_deployment()), container(rebalancer_cronjob_pod())
    for key in ("image", "securityContext", "volumeMounts", "envFrom", "resources"):
        assert job[key] == daemon[key], key
    assert not {"ports", "livenessProbe", "readinessProbe"} & set(job)


def test_the_command_accepts_the_deployment_args_and_the_go_live_change() -> None:
    args = container(rebalancer_deployment())["args"]
    parsed = _run_parser().parse_args(args)
    assert parsed.command == "run"
    assert parsed.policy == "/etc/gpu-rebalancer/policy.yaml"
    assert parsed.dry_run is True  # forced, whatever the policy says
    assert parsed.leader_election is True
    assert parsed.listen == ("0.0.0.0", 8080)  # the port the probes, Service and image use
    live = _run_parser().parse_args([("--no-dry-run" if a == "--dry-run" else a) for a in args])
    assert live.dry_run is False


def test_the_policy_is_mounted_where_the_command_reads_it() -> None:
    deployment = rebalancer_deployment()
    spec = deployment["spec"]["template"]["spec"]
    policy_path = Path(container(deployment)["args"][2])
    mount = next(
        m for m in container(deployment)["volumeMounts"] if m["mountPath"] == str(policy_path.parent)
    )
    assert mount["readOnly"] is True
    assert "subPath" not in mount, "a subPath mount never sees ConfigMap updates (no hot reload)"
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    configmap = find("ConfigMap", volume["configMap"]["name"])
    assert policy_path.name in configmap["data"]
    # The image's default command reads the same file.
    assert dockerfile_instruction("CMD")[-1] == f'["run", "--policy", "{policy_path}"]'


def test_the_deployment_is_locked_down() -> None:
    deployment = rebalancer_deployment()
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == dockerfile_user()
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container(deployment)["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in security
    assert pod["serviceAccountName"] == find("ServiceAccount", "gpu-rebalancer")["metadata"]["name"]
    assert find("PriorityClass", pod["priorityClassName"])
    resources = container(deployment)["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]


def test_the_probes_hit_the_health_endpoints_on_the_http_port() -> None:
    main = container(rebalancer_deployment())
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports == {"http": 8080}
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert dockerfile_instruction("EXPOSE") == ["8080"]


def test_the_image_is_the_project_version_named_once() -> None:
    version = project_version()
    component = yaml.safe_load((COMPONENTS / "image" / "kustomization.yaml").read_text(encoding="utf-8"))
    assert component["images"] == [{"name": "gpu-rebalancer", "newName": "gpu-rebalancer", "newTag": version}]
    # The manifests name the image without a tag: the component gives it.
    assert container(rebalancer_deployment())["image"] == "gpu-rebalancer"
    assert container(rebalancer_cronjob_pod())["image"] == "gpu-rebalancer"
    named = [
        path.relative_to(ROOT)
        for path in sorted(DEPLOY.rglob("*.yaml"))
        if version in path.read_text(encoding="utf-8")
    ]
    assert named == [Path("deploy/components/image/kustomization.yaml")]
    assert "kustomization.yaml" not in {p.name for p in manifest_files()}
    assert "images" not in kustomization()


def test_the_dockerfile_takes_the_version_from_the_build_and_checks_it() -> None:
    assert "VERSION" not in dockerfile_args(), "the Dockerfile repeats the version (ARG VERSION=...)"
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert f"={project_version()}" not in text and f":{project_version()}" not in text
    check = next(line for line in dockerfile_lines() if line.startswith("RUN ") and "tomllib" in line)
    assert "pyproject.toml" in check and '"${VERSION}"' in check


def test_the_version_check_of_the_build_refuses_another_version(tmp_path: Path) -> None:
    """The build stage's check, run as the build runs it: in the directory pyproject.toml is copied to."""
    check = next(line for line in dockerfile_lines() if line.startswith("RUN ") and "tomllib" in line)
    (tmp_path / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    command = check.removeprefix("RUN ")

    def build(version: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", "-c", command.replace("python ", f"{sys.executable} ", 1)],
            cwd=tmp_path,
            env={**os.environ, "VERSION": version},
            capture_output=True,
            text=True,
            check=False,
        )

    assert build(project_version()).returncode == 0
    wrong = build("9.9.9")
    assert wrong.returncode != 0 and f"pyproject.toml says {project_version()}" in wrong.stderr
    assert build("").returncode != 0


def test_make_image_builds_the_project_version() -> None:
    make = shutil.which("make")
    assert make is not None
    dry = subprocess.run([make, "-n", "image"], cwd=ROOT, capture_output=True, text=True, check=True)
    version = project_version()
    assert f"--build-arg VERSION={version} " in dry.stdout and f"-t gpu-rebalancer:{version} ." in dry.stdout


def test_the_credentials_come_from_the_optional_secret_of_the_template() -> None:
    secret = find("Secret", "gpu-rebalancer-credentials", templates=True)
    env_from = container(rebalancer_deployment())["envFrom"]
    assert env_from == [{"secretRef": {"name": secret["metadata"]["name"], "optional": True}}]


def test_the_secret_template_holds_only_marked_placeholders() -> None:
    path = DEPLOY / f"secret{TEMPLATE_SUFFIX}"
    (secret,) = load_documents(path)
    assert secret["kind"] == "Secret" and "data" not in secret
    values: dict[str, str] = secret["stringData"]
    assert {"SLACK_WEBHOOK_URL", "WEBHOOK_HMAC_SECRET", "PROMETHEUS_BEARER_TOKEN"} <= set(values)
    for key, value in values.items():
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), f"{key} is not an environment variable name"
        assert value.startswith("REPLACE-ME"), f"{key} must be a clearly marked placeholder"
    assert "NOT APPLIED" in path.read_text(encoding="utf-8")
    # The names an operator is told to put in the policy are ones the policy schema accepts.
    example = yaml.safe_load(
        "\n".join(
            line.removeprefix("#   ")
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.startswith("#   ") and not line.startswith("#   kubectl")
        )
    )
    loaded = loads_policy(yaml.safe_dump(example), "secret.example.yaml")
    named = {
        loaded.policy.notify.slack[0].webhook_url_env,
        loaded.policy.notify.webhooks[0].secret_env,
        loaded.policy.telemetry.prometheus.bearer_token_env
        if loaded.policy.telemetry and loaded.policy.telemetry.prometheus
        else None,
    }
    assert named == set(values)


def test_the_disruption_budgets_cover_their_deployments() -> None:
    for name in ("gpu-rebalancer", "gpu-packed-scheduler"):
        deployment = find("Deployment", name)
        pdb = find("PodDisruptionBudget", name)
        template_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels_match(pdb["spec"]["selector"]["matchLabels"], template_labels)
        assert pdb["spec"]["maxUnavailable"] == 1 < deployment["spec"]["replicas"]
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_selectors_match_their_pods_and_only_them() -> None:
    rebalancer = rebalancer_deployment()
    scheduler = find("Deployment", "gpu-packed-scheduler")
    for deployment in (rebalancer, scheduler):
        assert labels_match(
            deployment["spec"]["selector"]["matchLabels"],
            deployment["spec"]["template"]["metadata"]["labels"],
        )
    service = find("Service", "gpu-rebalancer")
    assert labels_match(service["spec"]["selector"], rebalancer["spec"]["template"]["metadata"]["labels"])
    assert not labels_match(service["spec"]["selector"], scheduler["spec"]["template"]["metadata"]["labels"])
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "http" and port["name"] == "http"


# --------------------------------------------------------------------------- the packed scheduler


def scheduler_config() -> Manifest:
    text = find("ConfigMap", "gpu-packed-scheduler-config")["data"]["config.yaml"]
    config: Manifest = yaml.safe_load(text)
    return config


# Fields of KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) and the parts used here; the
# scheduler rejects unknown fields, so a typo must fail here, not in the cluster.
_CONFIG_FIELDS = {
    "apiVersion", "kind", "parallelism", "leaderElection", "clientConnection", "enableProfiling",
    "enableContentionProfiling", "percentageOfNodesToScore", "podInitialBackoffSeconds",
    "podMaxBackoffSeconds", "profiles", "extenders", "delayCacheUntilActive",
}  # fmt: skip
_LEADER_ELECTION_FIELDS = {
    "leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock", "resourceName",
    "resourceNamespace",
}  # fmt: skip
_PROFILE_FIELDS = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}
_EXTENSION_POINTS = {
    "preEnqueue", "queueSort", "preFilter", "filter", "postFilter", "preScore", "score", "reserve",
    "permit", "preBind", "bind", "postBind", "multiPoint",
}  # fmt: skip


def test_the_scheduler_config_has_only_known_fields() -> None:
    config = scheduler_config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert set(config) <= _CONFIG_FIELDS
    assert set(config["leaderElection"]) <= _LEADER_ELECTION_FIELDS
    for profile in config["profiles"]:
        assert set(profile) <= _PROFILE_FIELDS
        assert set(profile["plugins"]) <= _EXTENSION_POINTS
        for point in profile["plugins"].values():
            assert set(point) <= {"enabled", "disabled"}
            for plugin in point.get("enabled", []) + point.get("disabled", []):
                assert set(plugin) <= {"name", "weight"}
        for entry in profile["pluginConfig"]:
            assert set(entry) == {"name", "args"}


def _fit_args() -> Manifest:
    (profile,) = scheduler_config()["profiles"]
    args: Manifest = next(c["args"] for c in profile["pluginConfig"] if c["name"] == "NodeResourcesFit")
    return args


def test_the_profile_name_is_what_consolidation_moves() -> None:
    (profile,) = scheduler_config()["profiles"]
    default = GpuConsolidationArgs().packed_schedulers
    assert default == (profile["schedulerName"],) == ("gpu-packed-scheduler",)
    # ... and the shipped policy keeps that default.
    loaded = loads_policy(policy_text())
    consolidation = next(s for s in loaded.strategies if s.name == "gpu-consolidation")
    assert isinstance(consolidation.args, GpuConsolidationArgs)
    assert consolidation.args.packed_schedulers == default


def test_the_profile_packs_gpus_with_the_weights_of_the_placement_simulation() -> None:
    strategy = _fit_args()["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    listed = [(r["name"], r["weight"]) for r in strategy["resources"]]
    # Exactly the resources and weights the placement model scores (rebalancer.scoring).
    assert listed == list(scoring.PROFILE_RESOURCES)
    weights = dict(listed)
    assert len(weights) == len(listed), "a resource is listed twice"
    assert all(1 <= w <= 100 for w in weights.values()), "the scheduler accepts weights 1-100"
    assert weights["nvidia.com/gpu"] == scoring.GPU_WEIGHT
    assert weights["cpu"] == scoring.CPU_WEIGHT
    assert weights["memory"] == scoring.MEMORY_WEIGHT
    assert weights["nvidia.com/gpu"] > max(weights["cpu"], weights["memory"])
    mig = {name: w for name, w in weights.items() if name.startswith("nvidia.com/mig-")}
    assert {"nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-7g.80gb"} <= set(mig)
    assert set(mig.values()) == {scoring.MIG_WEIGHT}
    for name in mig:
        assert re.fullmatch(r"nvidia\.com/mig-\dg\.\d+gb", name), name
    # GPU shares pack like the GPUs they are slices of (the policy's shared-GPU resources).
    for shared in GpuSharingConfig().resources:
        assert weights[shared] == scoring.GPU_WEIGHT


def test_the_profile_does_not_fight_packing() -> None:
    (profile,) = scheduler_config()["profiles"]
    score = profile["plugins"]["score"]
    # Every default scorer off; only those the placement model computes, with its weights.
    assert score["disabled"] == [{"name": "*"}]
    assert score["enabled"] == [
        {"name": "NodeResourcesFit", "weight": scoring.FIT_PLUGIN_WEIGHT},
        {"name": "NodeAffinity", "weight": scoring.NODE_AFFINITY_PLUGIN_WEIGHT},
    ]
    assert set(profile["plugins"]) == {"score"}  # no other extension point is changed
    spread = next(c["args"] for c in profile["pluginConfig"] if c["name"] == "PodTopologySpread")
    assert spread == {"defaultingType": "List", "defaultConstraints": []}


def test_the_profile_prefers_larger_gpu_nodes_exactly_as_the_placement_model_does() -> None:
    (profile,) = scheduler_config()["profiles"]
    args = next(c["args"] for c in profile["pluginConfig"] if c["name"] == "NodeAffinity")
    # Preferred terms only: a required one would be a filter every pod of the profile must pass.
    assert set(args) == {"addedAffinity"}
    assert set(args["addedAffinity"]) == {"preferredDuringSchedulingIgnoredDuringExecution"}
    terms = args["addedAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    # Read as a pod's own preferred node affinity would be (the same API type), then compared with the
    # terms placement adds to every pod.
    carrier = {
        "metadata": {"namespace": "ns", "name": "carrier"},
        "spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": terms}}},
    }
    read = pod_from_json(carrier, gangs=GangConfig(), sharing=GpuSharingConfig())
    assert read.preferred_affinity == PROFILE_PREFERENCES
    # ValidateNodeAffinityArgs: weights 1..100; Gt takes exactly one integer value.
    for preferred in read.preferred_affinity:
        assert 1 <= preferred.weight <= 100
        for requirement in preferred.term.match_expressions:
            assert requirement.operator == "Gt" and len(requirement.values) == 1
            assert requirement.values[0].isdigit()


def test_the_scheduler_scores_every_feasible_node() -> None:
    # Otherwise, above 100 nodes, only a rotating subset of the feasible nodes is scored and the
    # fullest node (the one predicted) is often not among them.
    config = scheduler_config()
    assert config["percentageOfNodesToScore"] == 100
    (profile,) = config["profiles"]
    assert profile.get("percentageOfNodesToScore", 100) == 100  # a profile value would override it


def test_the_scheduler_leads_on_its_own_lease() -> None:
    election = scheduler_config()["leaderElection"]
    assert election["leaderElect"] is True
    assert election["resourceLock"] == "leases"
    assert election["resourceName"] == "gpu-packed-scheduler"
    assert election["resourceNamespace"] == NAMESPACE
    role = find("Role", "gpu-packed-scheduler-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [election["resourceName"]],
            "verbs": ["get", "update"],
        }
    ]
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]} in role[
        "rules"
    ]


def _bound_roles(service_account: str) -> set[tuple[str, str, str | None]]:
    """(kind, role name, binding namespace) bound to gpu-rebalancer/<service_account>."""
    bound = set()
    for _, doc in all_objects():
        if doc["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        subjects = doc["subjects"]
        if {"kind": "ServiceAccount", "name": service_account, "namespace": NAMESPACE} in subjects:
            bound.add((doc["roleRef"]["kind"], doc["roleRef"]["name"], doc["metadata"].get("namespace")))
    return bound


def test_the_scheduler_has_the_permissions_of_a_kube_scheduler() -> None:
    assert _bound_roles("gpu-packed-scheduler") == {
        ("ClusterRole", "system:kube-scheduler", None),
        ("ClusterRole", "system:volume-scheduler", None),
        ("Role", "extension-apiserver-authentication-reader", "kube-system"),
        ("Role", "gpu-packed-scheduler-leader-election", NAMESPACE),
    }


def test_the_scheduler_deployment_runs_the_config() -> None:
    deployment = find("Deployment", "gpu-packed-scheduler")
    pod = deployment["spec"]["template"]["spec"]
    main = container(deployment)
    assert deployment["spec"]["replicas"] == 2
    assert pod["serviceAccountName"] == "gpu-packed-scheduler"
    assert re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v1\.\d+\.\d+", main["image"])
    config_flag = next(arg for arg in main["command"] if arg.startswith("--config="))
    config_path = Path(config_flag.removeprefix("--config="))
    mount = next(m for m in main["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == "gpu-packed-scheduler-config"
    assert config_path.name in find("ConfigMap", "gpu-packed-scheduler-config")["data"]
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert main["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def test_the_namespace_enforces_the_restricted_pod_security_profile() -> None:
    labels = find("Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


# --------------------------------------------------------------------------- network and admission


def test_the_network_policy_selects_exactly_the_descheduler_pods() -> None:
    policy = find("NetworkPolicy", "gpu-rebalancer")
    selector = policy["spec"]["podSelector"]
    assert set(selector) == {"matchLabels"}
    assert labels_match(
        selector["matchLabels"], rebalancer_deployment()["spec"]["template"]["metadata"]["labels"]
    )
    scheduler = find("Deployment", "gpu-packed-scheduler")
    assert not labels_match(selector["matchLabels"], scheduler["spec"]["template"]["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]  # both directions default-deny


def test_only_the_http_port_is_open_inbound_and_only_from_inside_the_cluster() -> None:
    (rule,) = find("NetworkPolicy", "gpu-rebalancer")["spec"]["ingress"]
    (port,) = rule["ports"]
    main = container(rebalancer_deployment())
    named = {p["name"]: (p["containerPort"], p["protocol"]) for p in main["ports"]}
    assert (named.get(port["port"], (port["port"], "TCP"))[0], port["protocol"]) == (8080, "TCP")
    # The probes and the Service use that same port.
    assert main["livenessProbe"]["httpGet"]["port"] == main["readinessProbe"]["httpGet"]["port"] == "http"
    (service_port,) = find("Service", "gpu-rebalancer")["spec"]["ports"]
    assert named[service_port["targetPort"]][0] == 8080
    # Pods of any namespace, never an ipBlock (the outside world).
    assert rule["from"] == [{"namespaceSelector": {}}]


def test_egress_is_dns_the_api_server_prometheus_and_https_only() -> None:
    rules = find("NetworkPolicy", "gpu-rebalancer")["spec"]["egress"]
    allowed = {(p["port"], p["protocol"]) for rule in rules for p in rule["ports"]}
    assert allowed == {(53, "UDP"), (53, "TCP"), (443, "TCP"), (6443, "TCP"), (9090, "TCP")}
    assert all("endPort" not in p for rule in rules for p in rule["ports"])


def test_the_admission_policies_bind_to_the_rebalancer_service_account() -> None:
    account = find("ServiceAccount", "gpu-rebalancer")["metadata"]
    username = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    policies = [d for _, d in all_objects() if d["kind"] == "ValidatingAdmissionPolicy"]
    assert {p["metadata"]["name"] for p in policies} == {
        "gpu-rebalancer-node-changes",
        "gpu-rebalancer-pod-changes",
        "gpu-rebalancer-workload-changes",
    }
    for policy in policies:
        (condition,) = policy["spec"]["matchConditions"]
        assert condition["expression"] == f"request.userInfo.username == '{username}'"
        assert (
            find("ValidatingAdmissionPolicyBinding", policy["metadata"]["name"])["spec"]["policyName"]
            == (policy["metadata"]["name"])
        )
