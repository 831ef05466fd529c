"""The live telemetry source against a local stand-in: query plan, presets, connection settings, faults.

Everything here runs without a real Prometheus; `test_prometheus_live.py` checks the PromQL against one.
"""

from __future__ import annotations

import json
import math
import shutil
import ssl
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rebalancer.model import Finding, Telemetry
from rebalancer.policy import LabelMapping, MetricConfig, PrometheusConfig, TelemetryConfig, parse_policy
from rebalancer.sources.prometheus import PrometheusTelemetrySource, query_plan
from rebalancer.telemetry.exposition import Sample, Series, parse_exposition, render_openmetrics
from rebalancer.telemetry.identity import PRESETS, resolve_preset
from rebalancer.telemetry.windows import aggregate
from tests.builders import NOW, pod

if TYPE_CHECKING:
    from tests.prometheus_server import StubFactory

pytest_plugins = ["tests.prometheus_server"]

UUID = "GPU-11111111-2222-3333-4444-555555555555"
LABELS = {"Hostname": "gpu-a-1", "UUID": UUID, "gpu": "0", "exported_namespace": "ml", "exported_pod": "p"}
PODS = {("ml", "p"): pod("p", "gpu-a-1")}
NV_LABELS = f'{{gpu_uuid="{UUID}",kubernetes_node="n1",namespace="ml",pod="p"}}'


def source(url: str, *, windows: tuple[int, ...] = (1800,), **conn: object) -> PrometheusTelemetrySource:
    settings = PrometheusConfig.model_validate({"url": url, **conn})
    return PrometheusTelemetrySource(TelemetryConfig(prometheus=settings), windows)


def unavailable(result: tuple[Telemetry, tuple[Finding, ...]]) -> str:
    telemetry, findings = result
    assert not telemetry.available
    assert telemetry.window(1800) is None
    assert [f.kind for f in findings] == ["telemetry-unavailable"]
    assert telemetry.problem is not None
    assert telemetry.problem in findings[0].detail
    return telemetry.problem


Answer = tuple[int, bytes]


def vector(samples: list[tuple[dict[str, str], float]]) -> Answer:
    """A 200 instant-vector answer at NOW, with NaN written the way Prometheus writes it."""
    result = [
        {"metric": labels, "value": [NOW.timestamp(), "NaN" if math.isnan(v) else repr(v)]}
        for labels, v in samples
    ]
    return 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def by_query(answers: dict[str, list[tuple[dict[str, str], float]]]) -> Callable[[dict[str, str]], Answer]:
    """A responder whose answer depends on the PromQL (prefix match); an empty vector otherwise."""

    def respond(params: dict[str, str]) -> Answer:
        query = params.get("query", "")
        for prefix, samples in answers.items():
            if query.startswith(prefix):
                return vector(samples)
        return vector([])

    return respond


# --------------------------------------------------------------------------- the query plan


def test_plan_is_one_query_per_metric_and_aggregate() -> None:
    plan = query_plan(TelemetryConfig(), [1800, 120])
    exprs = [q.expr for q in plan]
    assert len(exprs) == len(set(exprs))
    assert "sum_over_time(DCGM_FI_DEV_GPU_UTIL[1800s])" in exprs
    assert "count_over_time(DCGM_FI_DEV_GPU_UTIL[120s])" in exprs
    assert "max_over_time(DCGM_FI_DEV_FB_USED[1800s])" in exprs
    assert "DCGM_FI_DEV_FB_FREE" in exprs
    assert "timestamp(DCGM_FI_DEV_FB_USED)" in exprs
    # Windows longer than the 5m lookback find their newest sample with a lookback-stepped subquery.
    assert (
        "(timestamp(DCGM_FI_DEV_GPU_UTIL) or max_over_time(timestamp(DCGM_FI_DEV_GPU_UTIL)[1800s:300s])) "
        "and count_over_time(DCGM_FI_DEV_GPU_UTIL[1800s])"
    ) in exprs
    assert "timestamp(DCGM_FI_DEV_GPU_UTIL) and count_over_time(DCGM_FI_DEV_GPU_UTIL[120s])" in exprs
    # 2 instant queries per framebuffer metric, 4 utilisation/fb aggregates and 3 newest per window.
    assert len(plan) == 2 * 2 + 2 * (4 + 3)
    assert all(q.window in (None, 120, 1800) for q in plan)


def test_every_query_is_evaluated_at_now_with_a_server_side_timeout(stub_prometheus: StubFactory) -> None:
    stub = stub_prometheus()
    src = source(stub.url, timeout="3s")
    telemetry, _ = src.telemetry(NOW.replace(microsecond=123456), PODS)
    assert len(stub.requests) == len(src.plan)
    assert {r["time"] for r in stub.requests} == {f"{int(NOW.timestamp())}.123"}
    assert {r["timeout"] for r in stub.requests} == {"3s"}
    # An empty answer is no data, and no data is never idle.
    assert not telemetry.available


# --------------------------------------------------------------------------- presets


def test_presets_fill_only_what_the_policy_leaves_unset() -> None:
    default = TelemetryConfig()
    assert resolve_preset(default) is default  # no preset written: the broad built-in mapping stays

    legacy = resolve_preset(TelemetryConfig(preset="dcgm-exporter-legacy"))
    assert legacy.labels.node == ("Hostname", "kubernetes_node", "node")
    modern = resolve_preset(TelemetryConfig(preset="dcgm-exporter"))
    assert modern.labels.node[0] == "hostname"
    exported = resolve_preset(TelemetryConfig(preset="dcgm-exporter-exported"))
    assert (exported.labels.pod, exported.labels.namespace) == (("exported_pod",), ("exported_namespace",))

    nv = resolve_preset(TelemetryConfig(preset="nv-gpu"))
    assert nv.utilization == MetricConfig(name="nv_gpu_utilization", scale=100.0)
    assert nv.fb_used.name == "nv_gpu_memory_used_bytes"
    assert nv.labels.uuid[0] == "gpu_uuid"
    assert resolve_preset(nv) == nv

    mine = LabelMapping(node=("kubernetes_node",))
    own = resolve_preset(TelemetryConfig(preset="dcgm-exporter-legacy", labels=mine))
    assert own.labels == mine
    assert set(PRESETS) == {"dcgm-exporter", "dcgm-exporter-legacy", "dcgm-exporter-exported", "nv-gpu"}


def test_policy_preset_reaches_both_sources() -> None:
    loaded = parse_policy({"telemetry": {"preset": "nv-gpu"}})
    cfg = loaded.policy.telemetry
    assert cfg is not None
    assert {q.metric for q in query_plan(cfg, [600])} == {
        "nv_gpu_utilization",
        "nv_gpu_memory_used_bytes",
        "DCGM_FI_DEV_FB_FREE",
    }
    t0 = NOW.timestamp()
    text = "\n".join(
        [
            "# TYPE nv_gpu_utilization gauge",
            *(f"nv_gpu_utilization{NV_LABELS} 0.25 {t0 - s}" for s in (60, 0)),
            "# TYPE nv_gpu_memory_used_bytes gauge",
            f"nv_gpu_memory_used_bytes{NV_LABELS} 2147483648 {t0}",
            "# EOF",
        ]
    )
    telemetry, findings = aggregate(parse_exposition(text, source="nv.om"), cfg, [600], NOW, PODS)
    window = telemetry.window(600)
    assert window is not None
    (row,) = window.gpus
    assert (row.node, row.uuid, row.pod_key) == ("n1", UUID, ("ml", "p"))
    assert row.util_avg_percent == 25.0
    assert row.fb_used_mib == 2048.0
    assert findings == ()


# --------------------------------------------------------------------------- answers


def test_nan_aggregate_is_dropped_with_a_finding_never_read_as_idle(stub_prometheus: StubFactory) -> None:
    t0 = NOW.timestamp()
    stub = stub_prometheus(
        responder=by_query(
            {
                "count_over_time(DCGM_FI_DEV_GPU_UTIL": [(LABELS, 30.0)],
                "sum_over_time(DCGM_FI_DEV_GPU_UTIL": [(LABELS, math.nan)],
                "max_over_time(DCGM_FI_DEV_GPU_UTIL": [(LABELS, 3.0)],
                "(timestamp(DCGM_FI_DEV_GPU_UTIL)": [(LABELS, t0)],
                "DCGM_FI_DEV_FB_USED": [(LABELS, 100.0)],
                "timestamp(DCGM_FI_DEV_FB_USED)": [(LABELS, t0)],
            }
        )
    )
    telemetry, findings = source(stub.url).telemetry(NOW, PODS)
    window = telemetry.window(1800)
    assert window is not None
    (row,) = window.gpus
    assert row.pod_key == ("ml", "p")
    assert (row.util_avg_percent, row.util_max_percent, row.util_samples) == (None, None, 0)
    assert row.fb_used_mib == 100.0
    assert row.newest_sample == NOW
    (bad,) = findings
    assert bad.kind == "bad-telemetry"
    assert (bad.node, bad.gpu, bad.pod) == ("gpu-a-1", UUID, "p")
    assert "DCGM_FI_DEV_GPU_UTIL" in bad.detail


def test_a_scalar_answer_is_unavailable(stub_prometheus: StubFactory) -> None:
    body = json.dumps({"status": "success", "data": {"resultType": "scalar", "result": [1, "NaN"]}})
    stub = stub_prometheus(responder=lambda _p: (200, body.encode()))
    problem = unavailable(source(stub.url).telemetry(NOW, PODS))
    assert "instant vector" in problem
    assert len(stub.requests) == 1  # the first bad answer stops the cycle's queries


def test_series_without_node_or_uuid_label_are_reported_and_ignored(stub_prometheus: StubFactory) -> None:
    t0 = NOW.timestamp()
    no_uuid = {k: v for k, v in LABELS.items() if k != "UUID"}
    no_node = {k: v for k, v in LABELS.items() if k != "Hostname"}
    stub = stub_prometheus(
        responder=by_query(
            {
                "count_over_time(DCGM_FI_DEV_GPU_UTIL": [(no_uuid, 30.0), (no_node, 30.0)],
                "sum_over_time(DCGM_FI_DEV_GPU_UTIL": [(no_uuid, 1.0), (no_node, 1.0)],
                "max_over_time(DCGM_FI_DEV_GPU_UTIL": [(no_uuid, 1.0), (no_node, 1.0)],
                "(timestamp(DCGM_FI_DEV_GPU_UTIL)": [(no_uuid, t0), (no_node, t0)],
            }
        )
    )
    telemetry, findings = source(stub.url).telemetry(NOW, PODS)
    assert not telemetry.available
    assert telemetry.problem is not None and "carries both a node and a GPU UUID" in telemetry.problem
    assert sorted(f.kind for f in findings) == [
        "telemetry-unavailable",
        "unusable-telemetry",
        "unusable-telemetry",
    ]
    details = " ".join(f.detail for f in findings)
    assert "no node label" in details and "no GPU UUID label" in details


# --------------------------------------------------------------------------- faults


def test_http_500_is_retried_a_bounded_number_of_times(stub_prometheus: StubFactory) -> None:
    stub = stub_prometheus(responder=lambda _p: (500, b'{"status":"error","error":"boom"}'))
    problem = unavailable(source(stub.url, retries=2).telemetry(NOW, PODS))
    assert "HTTP Status Code 500" in problem
    assert len(stub.requests) == 3  # one try and two retries, then the cycle stops asking


def test_http_400_is_not_retried(stub_prometheus: StubFactory) -> None:
    body = b'{"status":"error","errorType":"bad_data","error":"parse error"}'
    stub = stub_prometheus(responder=lambda _p: (400, body))
    problem = unavailable(source(stub.url, retries=2).telemetry(NOW, PODS))
    assert "400" in problem and "parse error" in problem
    assert len(stub.requests) == 1


def test_invalid_json_is_unavailable(stub_prometheus: StubFactory) -> None:
    stub = stub_prometheus(responder=lambda _p: (200, b"<html>proxy error</html>"))
    problem = unavailable(source(stub.url).telemetry(NOW, PODS))
    assert "invalid response" in problem


def test_a_stall_gives_up_after_timeout_times_tries(stub_prometheus: StubFactory) -> None:
    stub = stub_prometheus(delay=10.0)
    src = source(stub.url, timeout="1s", retries=1)
    started = time.monotonic()
    problem = unavailable(src.telemetry(NOW, PODS))
    elapsed = time.monotonic() - started
    assert "timed out" in problem
    assert len(stub.requests) == 2
    assert 1.9 <= elapsed < 1.0 * (1 + 1) + 1.5


def test_nothing_listening_is_unavailable(stub_prometheus: StubFactory) -> None:
    stub = stub_prometheus()
    url = stub.url
    stub.stop()
    problem = unavailable(source(url, retries=1).telemetry(NOW, PODS))
    assert "cannot connect" in problem


def test_no_prometheus_configured_is_unavailable() -> None:
    src = PrometheusTelemetrySource(TelemetryConfig(), [1800])
    assert "telemetry.prometheus.url" in unavailable(src.telemetry(NOW, PODS))


# --------------------------------------------------------------------------- connection settings


def test_bearer_token_from_file_is_read_on_every_call(tmp_path: Path, stub_prometheus: StubFactory) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    stub = stub_prometheus()
    src = source(stub.url, bearer_token_file=str(token))
    src.telemetry(NOW, PODS)
    token.write_text("rotated")
    src.telemetry(NOW, PODS)
    auth = [r["authorization"] for r in stub.headers]
    assert auth[0] == "Bearer first"
    assert auth[-1] == "Bearer rotated"


def test_bearer_token_from_env_and_missing_secrets(tmp_path: Path, stub_prometheus: StubFactory) -> None:
    stub = stub_prometheus()
    conn = PrometheusConfig(url=stub.url, bearer_token_env="PROM_TOKEN")
    src = PrometheusTelemetrySource(TelemetryConfig(prometheus=conn), [1800], environ={"PROM_TOKEN": "s3"})
    src.telemetry(NOW, PODS)
    assert stub.headers[0]["authorization"] == "Bearer s3"
    count = len(stub.requests)

    missing = PrometheusTelemetrySource(TelemetryConfig(prometheus=conn), [1800], environ={})
    assert "PROM_TOKEN is not set" in unavailable(missing.telemetry(NOW, PODS))
    gone = source(stub.url, bearer_token_file=str(tmp_path / "nope"))
    assert "cannot read bearer token file" in unavailable(gone.telemetry(NOW, PODS))
    assert len(stub.requests) == count  # never asks without the credentials it was told to use


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    assert shutil.which("openssl") is not None, "openssl is needed to make a test certificate"
    root = tmp_path_factory.mktemp("tls")
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_tls_verification_uses_the_ca_bundle(
    certificate: tuple[Path, Path], stub_prometheus: StubFactory
) -> None:
    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    stub = stub_prometheus(tls=context)
    assert stub.url.startswith("https://")
    problem = unavailable(source(stub.url, retries=0).telemetry(NOW, PODS))
    assert "CERTIFICATE_VERIFY_FAILED" in problem or "certificate verify failed" in problem
    before = len(stub.requests)
    trusted = source(stub.url, ca_file=str(cert))
    trusted.telemetry(NOW, PODS)
    insecure = source(stub.url, verify_tls=False)
    insecure.telemetry(NOW, PODS)
    assert len(stub.requests) == before + 2 * len(trusted.plan)


# --------------------------------------------------------------------------- OpenMetrics for snapshots


def test_render_openmetrics_round_trips_through_the_snapshot_parser() -> None:
    t0 = NOW.timestamp()
    series = [
        Series(
            metric="DCGM_FI_DEV_GPU_UTIL",
            labels={**LABELS, "odd": 'quote " back \\ slash'},
            samples=(Sample(5.5, t0 - 30.25), Sample(math.nan, t0 - 0.001), Sample(1e21, t0)),
        ),
        Series(metric="DCGM_FI_DEV_FB_USED", labels=LABELS, samples=(Sample(1.0, None), Sample(7.0, t0))),
    ]
    text = render_openmetrics(series)
    assert text.endswith("# EOF\n")
    parsed = {s.metric: s for s in parse_exposition(text, source="x.om", fmt="openmetrics")}
    util = parsed["DCGM_FI_DEV_GPU_UTIL"]
    assert util.labels["odd"] == 'quote " back \\ slash'
    assert [s.timestamp for s in util.samples] == [t0 - 30.25, t0 - 0.001, t0]
    assert util.samples[0].value == 5.5 and math.isnan(util.samples[1].value)
    assert util.samples[2].value == 1e21
    assert parsed["DCGM_FI_DEV_FB_USED"].samples == (Sample(7.0, t0),)


def test_now_must_carry_a_timezone_but_never_raises(stub_prometheus: StubFactory) -> None:
    stub = stub_prometheus()
    naive = datetime(2026, 11, 29, 12, 0)
    problem = unavailable(source(stub.url).telemetry(naive, PODS))
    assert "timezone" in problem
