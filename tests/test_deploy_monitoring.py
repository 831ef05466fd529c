"""Monitoring in deploy/: ServiceMonitor, PrometheusRule alerts and the Grafana dashboard.

- the Prometheus Operator objects (no schema in kubernetes-validate) have their required fields and
  point at the Service's port;
- every alert expression and annotation template passes `promtool check rules`, and `promtool test
  rules` shows each alert firing on the series the metrics sink really exports (label values taken
  from the code) and staying quiet on a healthy replica pair, and on the last cycle of a replica that
  lost the Lease (alerts and panels read the per-cycle gauges of the leader only);
- the dashboard parses, is the same in its ConfigMap and in grafana/, has the panels operators need,
  and every metric it queries is one DESIGN §8 lists and the metrics sink registers: each query is
  evaluated by promtool over a real scrape of the sink's registry (after a cycle of the demo
  cluster) and must return data.

promtool comes from the Debian package `prometheus` (installed when missing and running as root).
"""

from __future__ import annotations

import json
import re
import subprocess
import typing
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rebalancer.cycle import run_cycle
from rebalancer.cycle_report import CycleReport, PredictionCheck
from rebalancer.evictor import DryRunEvictor
from rebalancer.finding_kinds import FINDING_KINDS
from rebalancer.guards import PDB
from rebalancer.model import PREDICTION_RESULTS, OutcomeResult
from rebalancer.policy import LoadedPolicy, loads_policy, parse_policy
from rebalancer.sinks.metrics import CYCLE_GAUGES, CYCLE_RESULTS, DaemonMetrics
from rebalancer.sources.files import load_snapshot_dir
from rebalancer.sources.kube_cache import KubeCache, ListStatus
from rebalancer.sources.snapshot_history import with_directory_usage
from tests.builders import replace
from tests.fake_apiserver import FakeApiServer, node_json, pod_json
from tests.test_deploy import DEPLOY, NAMESPACE, ROOT, find

Manifest = dict[str, Any]

# DESIGN §8 (contract): every gpu_rebalancer_ metric, with its labels.
DESIGN_METRICS: dict[str, frozenset[str]] = {
    "gpu_rebalancer_evictions_total": frozenset({"strategy", "result", "mode"}),
    "gpu_rebalancer_proposals_total": frozenset({"strategy"}),
    "gpu_rebalancer_blocked_total": frozenset({"strategy", "guard"}),
    "gpu_rebalancer_cycle_duration_seconds": frozenset(),
    "gpu_rebalancer_cycles_total": frozenset({"result"}),
    "gpu_rebalancer_last_success_timestamp_seconds": frozenset(),
    "gpu_rebalancer_nodes_freeable": frozenset({"gpu_model"}),
    "gpu_rebalancer_idle_gpus": frozenset({"gpu_model"}),
    "gpu_rebalancer_leaked_vram_bytes": frozenset({"node"}),
    "gpu_rebalancer_estimated_savings_per_hour": frozenset(),
    "gpu_rebalancer_build_info": frozenset({"version", "python"}),
    # Additive to §8: GPUs on the freed nodes (the "GPUs freed" panels) and the safety valve.
    "gpu_rebalancer_gpus_freeable": frozenset({"gpu_model"}),
    "gpu_rebalancer_circuit_open": frozenset(),
    # Additive to §8: where the replacements of evicted pods landed, against the prediction.
    "gpu_rebalancer_predictions_total": frozenset({"strategy", "result"}),
    # Additive to §8: idle GPU-hours by team, and what idle-gpu did to idle workloads.
    "gpu_rebalancer_idle_gpu_seconds_total": frozenset({"namespace"}),
    "gpu_rebalancer_workload_actions_total": frozenset({"strategy", "action", "result", "mode"}),
    # Additive to §8: what the right-sizing advice would save, by team.
    "gpu_rebalancer_rightsizing_savings_per_hour": frozenset({"namespace"}),
    # Additive to §8: the daemon's watch cache, how long since the API server spoke, how often relisted.
    "gpu_rebalancer_cluster_cache_age_seconds": frozenset({"kind"}),
    "gpu_rebalancer_cluster_cache_relists_total": frozenset({"kind", "reason"}),
    # Additive to §8: which replica leads (the per-cycle gauges are read from it only).
    "gpu_rebalancer_leader": frozenset(),
    # Additive to §8: the last cycle's findings by kind (telemetry-unavailable: no GPU telemetry read).
    "gpu_rebalancer_findings": frozenset({"kind"}),
    # Additive to §8: whether the policy file on disk is the policy that runs.
    "gpu_rebalancer_policy_valid": frozenset(),
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Labels Prometheus adds to every scraped series (ServiceMonitor target labels).
TARGET_LABELS = frozenset({"namespace", "pod", "job", "instance", "service", "endpoint", "container"})
PROMQL_LABEL_FUNCTIONS = {"le"}  # histogram_quantile's bucket label
# Grafana's variables, replaced by values PromQL accepts.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$namespace": ".*"}
REQUIRED_ALERTS = {
    "GpuRebalancerCyclesFailing",
    "GpuRebalancerNoSuccessfulCycle",
    "GpuRebalancerCircuitOpen",
    "GpuRebalancerEvictionsBlockedByPdb",
    "GpuRebalancerLeakedVram",
    "GpuRebalancerTelemetryStale",
    "GpuRebalancerPolicyNotApplied",
    "GpuRebalancerPredictionsMissed",
}

_METRIC = re.compile(r"\b(gpu_rebalancer_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+)\b(\s*\{(?P<matchers>[^}]*)\})?")
_MATCHER = re.compile(r"(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*\"(?P<value>[^\"]*)\"")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\((?P<labels>[^)]*)\)")


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def promtool() -> str:
    from tests.prometheus_server import ensure_prometheus

    return ensure_prometheus()[1]


def run_promtool(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=120
    )


def base_name(sample_name: str) -> str:
    for suffix in HISTOGRAM_SUFFIXES:
        if sample_name.endswith(suffix) and sample_name.removesuffix(suffix) in DESIGN_METRICS:
            return sample_name.removesuffix(suffix)
    return sample_name


def metric_selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """(metric name, {label: value}) of every gpu_rebalancer_ / DCGM selector in a PromQL expression."""
    found = []
    for match in _METRIC.finditer(expr):
        matchers = {m["label"]: m["value"] for m in _MATCHER.finditer(match["matchers"] or "")}
        found.append((match.group(1), matchers))
    return found


def grouping_labels(expr: str) -> set[str]:
    return {
        label.strip()
        for match in _GROUPING.finditer(expr)
        for label in match["labels"].split(",")
        if label.strip()
    }


def grafana_to_promql(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


# --------------------------------------------------------------------------- the metrics sink, scraped


def demo_policy_advising() -> LoadedPolicy:
    """The demo policy, also running gpu-rightsizing over the two hours of the demo's history."""
    demo = ROOT / "examples" / "demo-cluster"
    raw = yaml.safe_load((demo / "policy.yaml").read_text(encoding="utf-8"))
    raw["strategies"].append({"name": "gpu-rightsizing", "args": {"window": "2h", "step": "1m"}})
    return loads_policy(yaml.safe_dump(raw), "demo policy advising")


def demo_report() -> CycleReport:
    """A dry cycle of the demo cluster, advising too, with the landings a live cycle would judge."""
    demo = ROOT / "examples" / "demo-cluster"
    loaded = demo_policy_advising()
    snapshot = with_directory_usage(load_snapshot_dir(demo, loaded), demo, loaded)
    return with_landings(run_cycle(snapshot, loaded, DryRunEvictor()))


def cache_status() -> tuple[ListStatus, ...]:
    """What a real watch cache over the fake API server says after its first sync and a relist (pods
    translated under a policy with gangs)."""
    with FakeApiServer() as api:
        api.add(node_json("gpu-1"))
        api.add(pod_json("train-0", "gpu-1", gpus=1))
        with api.api_client() as api_client:
            cache = KubeCache(api_client)
            try:
                cache.read(parse_policy({}))
                cache.read(parse_policy({"gangs": {"keys": ["team-job"]}}))
                return cache.status()
            finally:
                cache.stop()


@pytest.fixture(scope="module")
def watched() -> tuple[ListStatus, ...]:
    return cache_status()


def scrape(watched: tuple[ListStatus, ...]) -> dict[str, frozenset[str]]:
    """Sample name -> label names, from the text exposition of a metrics sink that saw real cycles."""
    report = demo_report()
    metrics = DaemonMetrics()
    metrics.watch_cache(lambda: watched)
    metrics.cycle_took(1.5)
    metrics.publish(report)
    metrics.publish(later(report))  # a second cycle counts the idle GPU-seconds since the first
    metrics.cycle_failed(0.2)
    metrics.cycle_not_run("standby")
    exposition = generate_latest(metrics.registry).decode()
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in samples.items()}


def later(report: CycleReport) -> CycleReport:
    """The same report five minutes later, as the next cycle of an unchanged cluster."""
    return replace(report, now=report.now + timedelta(minutes=5))


def with_landings(report: CycleReport) -> CycleReport:
    """The report with the landings a live cycle judges (a dry run evicts nothing, so judges none)."""
    checks = tuple(
        PredictionCheck("gpu-consolidation", "ml", f"train-{n}", "gpu-a-1", result, "gpu-a-1", f"train-{n}x")
        for n, result in enumerate(PREDICTION_RESULTS)
    )
    return replace(report, predictions=checks)


@pytest.fixture(scope="module")
def scraped(watched: tuple[ListStatus, ...]) -> dict[str, frozenset[str]]:
    return scrape(watched)


def scraped_series(scraped_text: str) -> list[tuple[str, dict[str, str], float, bool]]:
    """(sample name, labels, value, is a counter sample) of an exposition."""
    series = []
    for family in text_string_to_metric_families(scraped_text):
        counter = family.type in ("counter", "histogram")
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            series.append((sample.name, dict(sample.labels), float(sample.value), counter))
    return series


def test_the_sink_exports_every_design_metric_with_its_labels(scraped: dict[str, frozenset[str]]) -> None:
    for name, labels in DESIGN_METRICS.items():
        if name == "gpu_rebalancer_cycle_duration_seconds":
            assert {f"{name}{suffix}" for suffix in HISTOGRAM_SUFFIXES} <= set(scraped)
            continue
        assert name in scraped, f"{name} is not exported"
        assert labels <= scraped[name], (
            f"{name} has labels {sorted(scraped[name])}, DESIGN §8 says {sorted(labels)}"
        )


def check_queries(
    exprs: Iterable[str], scraped: Mapping[str, frozenset[str]], *, allow_dcgm: set[str]
) -> None:
    for expr in exprs:
        selectors = metric_selectors(expr)
        assert selectors, f"no gpu-rebalancer metric in {expr!r}"
        known_labels = set(TARGET_LABELS) | PROMQL_LABEL_FUNCTIONS
        for name, matchers in selectors:
            if name.startswith("DCGM_"):
                assert name in allow_dcgm, f"{name} is not a metric the policy reads"
                continue
            base = base_name(name)
            assert base in DESIGN_METRICS, f"{name} (in {expr!r}) is not a DESIGN §8 metric"
            assert name in scraped, f"{name} (in {expr!r}) is not exported by the metrics sink"
            labels = scraped[name] | TARGET_LABELS
            assert set(matchers) <= labels, f"{name} has no label {sorted(set(matchers) - labels)} ({expr!r})"
            # An exposed label the target also sets is stored as exported_<label> (honorLabels unset).
            known_labels |= scraped[name] | {f"exported_{label}" for label in scraped[name] & TARGET_LABELS}
        unknown = grouping_labels(expr) - known_labels
        assert not unknown, f"grouping by labels no queried metric has: {sorted(unknown)} in {expr!r}"


# --------------------------------------------------------------------------- ServiceMonitor


def test_the_service_monitor_scrapes_the_metrics_port() -> None:
    monitor = find("ServiceMonitor", "gpu-rebalancer")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = find("Service", "gpu-rebalancer")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector and all(service["metadata"]["labels"].get(k) == v for k, v in selector.items())
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert re.fullmatch(r"\d+[smh]", endpoint["interval"])
    assert set(monitor["spec"]) <= {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels"}


# --------------------------------------------------------------------------- PrometheusRule


def rule_groups() -> list[Manifest]:
    rule = find("PrometheusRule", "gpu-rebalancer")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(rule["spec"]) == {"groups"}
    groups: list[Manifest] = rule["spec"]["groups"]
    return groups


def alerts() -> dict[str, Manifest]:
    return {rule["alert"]: rule for group in rule_groups() for rule in group["rules"]}


def test_the_prometheus_rule_has_the_required_fields() -> None:
    groups = rule_groups()
    assert groups and len({g["name"] for g in groups}) == len(groups)
    for group in groups:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
            assert rule["alert"] and rule["expr"].strip()
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
            assert re.fullmatch(r"\d+[smh]", rule["for"])
    assert set(alerts()) == REQUIRED_ALERTS


def test_alert_expressions_query_exported_metrics(scraped: dict[str, frozenset[str]]) -> None:
    """Only the rebalancer's own: no alert depends on the exporter's metric names (`telemetry.preset`)."""
    check_queries((rule["expr"] for rule in alerts().values()), scraped, allow_dcgm=set())


def test_alert_label_values_are_ones_the_code_uses() -> None:
    outcomes = set(typing.get_args(OutcomeResult))
    for rule in alerts().values():
        for name, matchers in metric_selectors(rule["expr"]):
            if name == "gpu_rebalancer_cycles_total":
                assert matchers["result"] in CYCLE_RESULTS
            if name == "gpu_rebalancer_evictions_total":
                assert matchers["result"] in outcomes
            if name == "gpu_rebalancer_blocked_total":
                assert matchers["guard"] == PDB
            if name == "gpu_rebalancer_predictions_total" and "result" in matchers:
                assert set(matchers["result"].split("|")) <= set(PREDICTION_RESULTS)
            if name == "gpu_rebalancer_findings":
                assert matchers["kind"] in FINDING_KINDS


def write_rules(directory: Path) -> Path:
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False), encoding="utf-8")
    return path


def test_promtool_accepts_every_rule(promtool: str, tmp_path: Path) -> None:
    write_rules(tmp_path)
    done = run_promtool(promtool, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_promtool_rejects_a_broken_expression(promtool: str, tmp_path: Path) -> None:
    """The check above is real: a PromQL syntax error fails it."""
    group = {
        "name": "broken",
        "rules": [{"alert": "Broken", "expr": "sum by (namespace (gpu_rebalancer_build_info)"}],
    }
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [group]}), encoding="utf-8")
    assert run_promtool(promtool, "check", "rules", "rules.yaml", cwd=tmp_path).returncode != 0


# Replicas as Prometheus sees them: the leader and the standby, each scraped on its own.
LEADER = {"namespace": NAMESPACE, "pod": "gpu-rebalancer-a", "job": "gpu-rebalancer"}
STANDBY = {"namespace": NAMESPACE, "pod": "gpu-rebalancer-b", "job": "gpu-rebalancer"}


def series(name: str, values: str, target: Mapping[str, str] = LEADER, **labels: str) -> dict[str, str]:
    """A series as Prometheus stores the scrape: with the ServiceMonitor's `honorLabels` unset, an
    exposed label the target also sets (`namespace`) is kept as `exported_<label>`."""
    exposed = {f"exported_{key}" if key in target else key: value for key, value in labels.items()}
    all_labels = {**target, **exposed}
    rendered = ",".join(f'{key}="{value}"' for key, value in sorted(all_labels.items()))
    return {"series": f"{name}{{{rendered}}}", "values": values}


def firing(at: str, *expected: Mapping[str, str]) -> dict[str, Any]:
    """A promql_expr_test: exactly these alerts (labels given) are firing at `at`."""
    keys = sorted({key for labels in expected for key in labels} | {"alertname"})
    return {
        "expr": f'count by ({", ".join(keys)}) (ALERTS{{alertstate="firing"}})',
        "eval_time": at,
        "exp_samples": [
            {"labels": "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}", "value": 1}
            for labels in expected
        ],
    }


def quiet(at: str) -> dict[str, Any]:
    return {"expr": 'count(ALERTS{alertstate="firing"})', "eval_time": at, "exp_samples": []}


def alert(name: str, **labels: str) -> dict[str, str]:
    return {"alertname": name, "severity": alerts()[name]["labels"]["severity"], **labels}


# A healthy pair: the leader succeeds every minute, the standby waits; telemetry flows.
HEALTHY = [
    series("gpu_rebalancer_cycles_total", "0+1x300", result="success"),
    series("gpu_rebalancer_cycles_total", "0x300", result="error"),
    series("gpu_rebalancer_cycles_total", "0+1x300", STANDBY, result="standby"),
    series("gpu_rebalancer_last_success_timestamp_seconds", "0+60x300"),
    series("gpu_rebalancer_last_success_timestamp_seconds", "0x300", STANDBY),
    series("gpu_rebalancer_build_info", "1x300", version="0.1.0", python="3.11.7"),
    series("gpu_rebalancer_build_info", "1x300", STANDBY, version="0.1.0", python="3.11.7"),
    series("gpu_rebalancer_leader", "1x300"),
    series("gpu_rebalancer_leader", "0x300", STANDBY),
    series("gpu_rebalancer_policy_valid", "1x300"),
    series("gpu_rebalancer_policy_valid", "1x300", STANDBY),
    series("gpu_rebalancer_leaked_vram_bytes", "0x300", node="gpu-a-1"),
    series("gpu_rebalancer_findings", "0x300", kind="telemetry-unavailable"),
    series("gpu_rebalancer_findings", "2x300", kind="stale-telemetry"),
    series(
        "gpu_rebalancer_evictions_total",
        "0+1x300",
        strategy="gpu-consolidation",
        result="evicted",
        mode="live",
    ),
    series("DCGM_FI_DEV_GPU_UTIL", "50x300", {"Hostname": "gpu-a-1", "gpu": "0"}),
    series(
        "gpu_rebalancer_predictions_total", "0+1x300", strategy="gpu-consolidation", result="as-predicted"
    ),
]


def _without(*names: str) -> list[dict[str, str]]:
    return [s for s in HEALTHY if not any(s["series"].startswith(f"{n}{{") for n in names)]


def alert_scenarios() -> list[dict[str, Any]]:
    ns = {"namespace": NAMESPACE}
    return [
        {"name": "healthy", "input_series": HEALTHY, "tests": [quiet("1h"), quiet("4h")]},
        {
            "name": "every cycle fails",
            "input_series": [
                *_without("gpu_rebalancer_cycles_total", "gpu_rebalancer_last_success_timestamp_seconds"),
                series("gpu_rebalancer_cycles_total", "3x300", result="success"),
                series("gpu_rebalancer_cycles_total", "0+1x300", result="error"),
                series("gpu_rebalancer_cycles_total", "0+1x300", STANDBY, result="standby"),
                series("gpu_rebalancer_last_success_timestamp_seconds", "180x300"),
                series("gpu_rebalancer_last_success_timestamp_seconds", "0x300", STANDBY),
            ],
            "tests": [
                quiet("10m"),  # failing for less than `for`
                firing("40m", alert("GpuRebalancerCyclesFailing", **ns)),
                # an hour after the last success (3m) plus 10 minutes: no successful cycle either
                firing(
                    "80m",
                    alert("GpuRebalancerCyclesFailing", **ns),
                    alert("GpuRebalancerNoSuccessfulCycle", **ns),
                ),
            ],
        },
        {
            "name": "the circuit opens",
            "input_series": [*HEALTHY, series("gpu_rebalancer_circuit_open", "0x10 1x100")],
            "tests": [quiet("10m"), firing("30m", alert("GpuRebalancerCircuitOpen", **ns))],
        },
        {
            "name": "PDBs block evictions for hours",
            "input_series": [
                *HEALTHY,
                series(
                    "gpu_rebalancer_evictions_total",
                    "0+1x300",
                    strategy="gpu-consolidation",
                    result="blocked-by-pdb",
                    mode="live",
                ),
                series("gpu_rebalancer_blocked_total", "0+1x300", strategy="idle-gpu", guard=PDB),
                # blocked once, then never again: not "for long"
                series("gpu_rebalancer_blocked_total", "0 1x300", strategy="topology-spread", guard=PDB),
                series("gpu_rebalancer_blocked_total", "0+1x300", strategy="gpu-affinity", guard="no-fit"),
            ],
            "tests": [
                quiet("90m"),
                firing(
                    "3h",
                    alert("GpuRebalancerEvictionsBlockedByPdb", strategy="gpu-consolidation", **ns),
                    alert("GpuRebalancerEvictionsBlockedByPdb", strategy="idle-gpu", **ns),
                ),
            ],
        },
        {
            "name": "leaked VRAM",
            "input_series": [
                *HEALTHY,
                series("gpu_rebalancer_leaked_vram_bytes", "0x10 2147483648x200", node="gpu-b-7"),
                # the standby still shows what it saw as leader long ago: only the leader's is read
                series("gpu_rebalancer_leaked_vram_bytes", "1073741824x200", STANDBY, node="gpu-b-7"),
            ],
            "tests": [
                quiet("30m"),  # the leader has seen it for 20 minutes only; the standby's does not count
                firing("45m", alert("GpuRebalancerLeakedVram", node="gpu-b-7", **ns)),
            ],
        },
        {
            # A replica that lost the Lease (an older version, or before its next tick clears them)
            # still exports its last cycle's gauges: they are not the cluster's state.
            "name": "an ex-leader's last cycle raises nothing",
            "input_series": [
                *HEALTHY,
                series("gpu_rebalancer_circuit_open", "0x300"),
                series("gpu_rebalancer_circuit_open", "1x300", STANDBY),
                series("gpu_rebalancer_leaked_vram_bytes", "2147483648x300", STANDBY, node="gpu-b-9"),
                series("gpu_rebalancer_findings", "1x300", STANDBY, kind="telemetry-unavailable"),
            ],
            "tests": [quiet("30m"), quiet("2h")],
        },
        {
            "name": "the lease moves while the circuit is open",
            "input_series": [
                *_without("gpu_rebalancer_leader"),
                # a leads with the circuit open; b takes over at 20m and finds every evicted pod
                # placed, while a still exports its last cycle's gauge
                series("gpu_rebalancer_leader", "1x20 0x100"),
                series("gpu_rebalancer_leader", "0x20 1x100", STANDBY),
                series("gpu_rebalancer_circuit_open", "1x120"),
                series("gpu_rebalancer_circuit_open", "0x120", STANDBY),
            ],
            "tests": [
                firing("15m", alert("GpuRebalancerCircuitOpen", **ns)),
                quiet("30m"),
                quiet("90m"),
            ],
        },
        {
            "name": "replacements land elsewhere than predicted",
            "input_series": [
                *HEALTHY,
                # 1 in 2 elsewhere: fires
                series(
                    "gpu_rebalancer_predictions_total",
                    "0+1x300",
                    strategy="gpu-consolidation",
                    result="elsewhere",
                ),
                # 9 in 10 on the predicted or a tied node: quiet
                series(
                    "gpu_rebalancer_predictions_total",
                    "0+5x300",
                    strategy="topology-spread",
                    result="as-predicted",
                ),
                series(
                    "gpu_rebalancer_predictions_total",
                    "0+4x300",
                    strategy="topology-spread",
                    result="equivalent",
                ),
                series(
                    "gpu_rebalancer_predictions_total",
                    "0+1x300",
                    strategy="topology-spread",
                    result="pending",
                ),
                # none as predicted at all (no such series): fires
                series(
                    "gpu_rebalancer_predictions_total", "0+1x300", strategy="gpu-affinity", result="pending"
                ),
                # two misses in six hours are too few to judge: quiet
                series(
                    "gpu_rebalancer_predictions_total",
                    "0x100 1x100 2x100",
                    strategy="idle-gpu",
                    result="elsewhere",
                ),
            ],
            "tests": [
                quiet("20m"),
                firing(
                    "1h",
                    alert("GpuRebalancerPredictionsMissed", strategy="gpu-consolidation", **ns),
                    alert("GpuRebalancerPredictionsMissed", strategy="gpu-affinity", **ns),
                ),
            ],
        },
        {
            # Prometheus unreachable from the rebalancer, its token refused, or no recent samples of the
            # metrics the policy reads: the exporter's series may be there or not.
            "name": "the rebalancer reads no GPU telemetry",
            "input_series": [
                *_without("gpu_rebalancer_findings"),
                series("gpu_rebalancer_findings", "0x5 1x200", kind="telemetry-unavailable"),
            ],
            "tests": [quiet("10m"), firing("30m", alert("GpuRebalancerTelemetryStale", **ns))],
        },
        {
            # A ConfigMap edit the daemons rejected (both watch the file): the standby's says so too.
            "name": "the policy file is not what runs",
            "input_series": [
                *_without("gpu_rebalancer_policy_valid"),
                series("gpu_rebalancer_policy_valid", "1x20 0x60 1x100"),
                series("gpu_rebalancer_policy_valid", "1x20 0x60 1x100", STANDBY),
            ],
            "tests": [
                quiet("25m"),  # rejected 5 minutes ago: less than `for`
                firing("45m", alert("GpuRebalancerPolicyNotApplied", **ns)),
                quiet("90m"),  # fixed at 80m
            ],
        },
        {
            # telemetry.preset nv-gpu, or a custom metric name: no DCGM_FI_ series at all, and the
            # rebalancer reads its telemetry.
            "name": "telemetry under another exporter's names",
            "input_series": _without("DCGM_FI_DEV_GPU_UTIL"),
            "tests": [quiet("30m"), quiet("2h")],
        },
    ]


def test_each_alert_fires_when_it_should_and_only_then(promtool: str, tmp_path: Path) -> None:
    write_rules(tmp_path)
    tests = [
        {"interval": "1m", "input_series": s["input_series"], "promql_expr_test": s["tests"]}
        for s in alert_scenarios()
    ]
    unit = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(unit, sort_keys=False), encoding="utf-8")
    done = run_promtool(promtool, "test", "rules", "alerts_test.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    fired = {labels["alertname"] for s in alert_scenarios() for t in s["tests"] for labels in _expected(t)}
    assert fired == REQUIRED_ALERTS, "every alert has a scenario that fires it"


def _expected(test: Mapping[str, Any]) -> Iterable[dict[str, str]]:
    for sample in test["exp_samples"]:
        yield dict(_MATCHER_PLAIN.findall(sample["labels"]))


_MATCHER_PLAIN = re.compile(r'([a-zA-Z_]+)="([^"]*)"')


# --------------------------------------------------------------------------- Grafana dashboard


def dashboard() -> Manifest:
    data: Manifest = json.loads((DEPLOY / "grafana" / "gpu-rebalancer.json").read_text(encoding="utf-8"))
    return data


def panels() -> list[Manifest]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_queries() -> list[str]:
    exprs = [target["expr"] for panel in panels() for target in panel["targets"]]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["query"]["query"])
    return exprs


def test_the_dashboard_configmap_holds_the_dashboard_file() -> None:
    configmap = find("ConfigMap", "gpu-rebalancer-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    (key,) = configmap["data"]
    assert key == "gpu-rebalancer.json"
    assert configmap["data"][key] == (DEPLOY / "grafana" / "gpu-rebalancer.json").read_text(encoding="utf-8")


def test_the_dashboard_is_well_formed() -> None:
    board = dashboard()
    assert board["uid"] == "gpu-rebalancer" and board["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], f"{panel['title']} queries nothing"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids))
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, f"{panel['title']} is wider than the dashboard"
    names = {v["name"] for v in board["templating"]["list"]}
    assert names == {"datasource", "namespace"}


def test_the_dashboard_has_the_panels_operators_need() -> None:
    titles = {p["title"] for p in panels()}
    for wanted in (
        "Evictions by strategy and result",
        "Nodes freed by GPU model",
        "GPUs freed by GPU model",
        "Estimated savings per hour",
        "Idle GPUs by model",
        "Cycle duration",
        "Blocked by guard",
        "Replacement landings by strategy and result",
        "Landed as predicted (range)",
        "Cluster cache age by kind",
        "Cluster cache relists by kind and reason",
    ):
        assert wanted in titles

    def queried(title: str) -> set[str]:
        panel = next(p for p in panels() if p["title"] == title)
        return {base_name(n) for t in panel["targets"] for n, _ in metric_selectors(t["expr"])}

    assert queried("Evictions by strategy and result") == {"gpu_rebalancer_evictions_total"}
    assert queried("Blocked by guard") == {"gpu_rebalancer_blocked_total"}
    assert queried("Idle GPUs by model") == {"gpu_rebalancer_idle_gpus", "gpu_rebalancer_leader"}
    assert queried("Cycle duration") == {"gpu_rebalancer_cycle_duration_seconds"}
    assert queried("Nodes freed by GPU model") == {"gpu_rebalancer_nodes_freeable", "gpu_rebalancer_leader"}
    assert queried("Estimated savings per hour") == {
        "gpu_rebalancer_estimated_savings_per_hour",
        "gpu_rebalancer_leader",
    }
    assert queried("Replacement landings by strategy and result") == {"gpu_rebalancer_predictions_total"}
    assert queried("Landed as predicted (range)") == {"gpu_rebalancer_predictions_total"}
    assert queried("Right-sizing savings per hour by namespace") == {
        "gpu_rebalancer_rightsizing_savings_per_hour",
        "gpu_rebalancer_leader",
    }
    assert queried("Cluster cache age by kind") == {"gpu_rebalancer_cluster_cache_age_seconds"}
    assert queried("Cluster cache relists by kind and reason") == {
        "gpu_rebalancer_cluster_cache_relists_total"
    }


def test_every_dashboard_metric_is_a_design_metric_the_sink_exports(
    scraped: dict[str, frozenset[str]],
) -> None:
    check_queries(dashboard_queries(), scraped, allow_dcgm=set())


def test_every_dashboard_query_returns_data_from_a_real_scrape(
    promtool: str, tmp_path: Path, watched: tuple[ListStatus, ...]
) -> None:
    """Each query, evaluated by Prometheus' engine over the sink's own exposition (leader and standby)."""
    report = demo_report()
    leader, standby = DaemonMetrics(), DaemonMetrics()
    leader.leader.set(1)  # as the daemon says of the replica holding the Lease
    leader.watch_cache(lambda: watched)  # the standby has listed nothing: no cache metrics
    leader.cycle_took(1.5)
    leader.publish(report)
    leader.publish(later(report))
    standby.cycle_not_run("standby")
    input_series = scraped_input({"gpu-rebalancer-a": leader, "gpu-rebalancer-b": standby})
    tests = []
    for expr in dashboard_queries():
        promql = grafana_to_promql(expr)
        if promql.startswith("label_values("):
            metric, label = (
                part.strip() for part in promql.removeprefix("label_values(").rstrip(")").split(",")
            )
            promql = f"count by ({label}) ({metric})"
        tests.append(
            {
                "expr": f"count({promql}) > bool 0",
                "eval_time": "1h",
                "exp_samples": [{"labels": "{}", "value": 1}],
            }
        )
    assert len(tests) >= 15
    unit = {"tests": [{"interval": "1m", "input_series": input_series, "promql_expr_test": tests}]}
    (tmp_path / "dashboard_test.yaml").write_text(yaml.safe_dump(unit, sort_keys=False), encoding="utf-8")
    done = run_promtool(promtool, "test", "rules", "dashboard_test.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def scraped_input(replicas: Mapping[str, DaemonMetrics]) -> list[dict[str, str]]:
    """promtool input series of each replica's exposition (by pod name), constant for two hours."""
    input_series = []
    for pod, metrics in replicas.items():
        target = {**LEADER, "pod": pod}
        for name, labels, value, counter in scraped_series(generate_latest(metrics.registry).decode()):
            values = f"{value:g}+{value:g}x120" if counter else f"{value:g}x120"
            input_series.append(series(name, values, target, **labels))
    return input_series


def reads_cycle_gauges(expr: str) -> bool:
    return any(base_name(name) in CYCLE_GAUGES for name, _ in metric_selectors(expr))


_LEADER_ONLY = re.compile(r"\band\s+on\s*\(\s*namespace\s*,\s*pod\s*\)\s*gpu_rebalancer_leader\s*==\s*1\b")


def test_per_cycle_gauges_are_read_from_the_leader_only() -> None:
    """Both replicas are scraped, and only the leader's last cycle describes the cluster."""
    exprs = [*(rule["expr"] for rule in alerts().values()), *dashboard_queries()]
    reading = [expr for expr in exprs if reads_cycle_gauges(expr)]
    assert len(reading) >= 8
    for expr in reading:
        gauges = sum(1 for name, _ in metric_selectors(expr) if base_name(name) in CYCLE_GAUGES)
        assert len(_LEADER_ONLY.findall(expr)) >= gauges, f"{expr!r} reads a standby's gauges too"


def test_just_after_a_takeover_no_panel_shows_the_ex_leaders_last_cycle(
    promtool: str, tmp_path: Path
) -> None:
    """The new leader has run no cycle yet; the ex-leader still exports its last one (until its next
    tick as standby clears it): the per-cycle panels are empty, not the ex-leader's."""
    report = demo_report()
    new_leader, ex_leader = DaemonMetrics(), DaemonMetrics()
    new_leader.leader.set(1)
    ex_leader.publish(report)
    ex_leader.publish(later(report))
    ex_leader.leader.set(0)
    input_series = scraped_input({"gpu-rebalancer-a": new_leader, "gpu-rebalancer-b": ex_leader})
    tests = [
        {"expr": grafana_to_promql(expr), "eval_time": "1h", "exp_samples": []}
        for expr in dashboard_queries()
        if reads_cycle_gauges(expr)
    ]
    assert len(tests) >= 6
    unit = {"tests": [{"interval": "1m", "input_series": input_series, "promql_expr_test": tests}]}
    (tmp_path / "takeover_test.yaml").write_text(yaml.safe_dump(unit, sort_keys=False), encoding="utf-8")
    done = run_promtool(promtool, "test", "rules", "takeover_test.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
