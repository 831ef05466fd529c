"""The live telemetry source against a local stand-in: query plan, presets, connection settings, faults.

Everything here runs without a real Prometheus; `test_prometheus_live.py` checks the PromQL against one.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from rebalancer.cli import main
from rebalancer.model import Finding, Telemetry
from rebalancer.policy import (
    LabelMapping,
    MetricConfig,
    PolicyError,
    PrometheusConfig,
    TelemetryConfig,
    parse_policy,
)
from rebalancer.sources.prometheus import PrometheusTelemetrySource, query_plan
from rebalancer.sources.prometheus_http import SERVICE_ACCOUNT_TOKEN
from rebalancer.sources.prometheus_plan import LATE_SELECT_LIMIT, late_query
from rebalancer.telemetry.exposition import Sample, Series, parse_exposition, render_openmetrics
from rebalancer.telemetry.identity import PRESETS, resolve_preset
from rebalancer.telemetry.windows import aggregate
from tests.builders import NOW, pod
from tests.fake_apiserver import FakeApiServer
from tests.prometheus_answers import USED, UTIL, Answer, plan_responder, vector

if TYPE_CHECKING:
    from tests.prometheus_server import StubFactory, StubPrometheus

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


# --------------------------------------------------------------------------- the query plan


# Every label the default mapping reads, sorted: what every answer is aggregated by.
BY = (
    "by (GPU_I_ID, GPU_I_PROFILE, Hostname, UUID, exported_namespace, exported_pod, gpu, hostname, "
    "kubernetes_node, modelName, namespace, node, pod, uuid)"
)


def test_plan_is_one_query_per_metric_and_aggregate_by_the_labels_attribution_reads() -> None:
    plan = query_plan(TelemetryConfig(), [1800, 120])
    exprs = [q.expr for q in plan]
    assert len(exprs) == len(set(exprs))
    assert f"sum {BY} (sum_over_time(DCGM_FI_DEV_GPU_UTIL[1800s]))" in exprs
    assert f"sum {BY} (count_over_time(DCGM_FI_DEV_GPU_UTIL[120s]))" in exprs
    assert f"max {BY} (max_over_time(DCGM_FI_DEV_GPU_UTIL[120s]))" in exprs
    assert f"max {BY} (max_over_time(DCGM_FI_DEV_FB_USED[1800s]))" in exprs
    # Freshness: each metric's newest sample within the lookback, exactly, at `now`.
    assert f"max {BY} (timestamp(DCGM_FI_DEV_FB_FREE))" in exprs
    assert f"max {BY} (timestamp(DCGM_FI_DEV_GPU_UTIL))" in exprs
    # The framebuffer's newest value over the widest window (the instant value when fresh).
    assert f"max {BY} (last_over_time(DCGM_FI_DEV_FB_USED[1800s]))" in exprs
    # How many series each label set holds, for the per-series sample bound.
    assert f"count {BY} (count_over_time(DCGM_FI_DEV_GPU_UTIL[1800s]))" in exprs
    # No subquery over the cluster: it cost seconds per metric and window (prometheus_plan).
    assert not [e for e in exprs if re.search(r"\[\d+s:\d+s\]", e)]
    # A timestamp, and for the framebuffer a newest value, per metric; 4 aggregates per window; 1.
    assert len(plan) == 3 + 2 + 2 * 4 + 1
    assert all(q.window in (None, 120, 1800) for q in plan)
    # The mapping's labels and nothing else: a label the policy maps is kept, any other one is not.
    own = TelemetryConfig(labels=LabelMapping(node=("kubernetes_node",), pod=("pod",), namespace=("ns",)))
    exprs = [q.expr for q in query_plan(own, [600])]
    assert all(
        "by (GPU_I_ID, GPU_I_PROFILE, UUID, gpu, kubernetes_node, modelName, ns, pod, uuid)" in e
        for e in exprs
    )


def test_the_late_query_asks_only_for_the_given_gpus_stepping_by_the_scrape_interval() -> None:
    cfg = TelemetryConfig(scrape_interval=30)
    expr = late_query(cfg, [1800, 3600], {"UUID": {"GPU-b", "GPU-a.1"}, "uuid": {'G"x'}})
    parts = expr.split(" or ")
    assert len(parts) == 3 * 2  # per metric, per UUID label name
    # Regex metacharacters escaped for RE2, then the PromQL string's backslashes and quotes.
    selector = r'DCGM_FI_DEV_GPU_UTIL{UUID=~"GPU\\-a\\.1|GPU\\-b"}'
    assert parts[0] == (
        f"label_replace(max {BY} (max_over_time(timestamp({selector})[3600s:30s])), "
        '"rebalancer_metric", "DCGM_FI_DEV_GPU_UTIL", "", "")'
    )
    assert r'DCGM_FI_DEV_FB_FREE{uuid=~"G\"x"}' in parts[-1]
    # An exporter fleet gone quiet: no list of thousands of UUIDs, every series at the lookback's step.
    many = {"UUID": {f"GPU-{n}" for n in range(LATE_SELECT_LIMIT + 1)}}
    parts = late_query(cfg, [1800, 3600], many).split(" or ")
    assert [p.split("(timestamp(")[1].split(")")[0] for p in parts] == [UTIL, USED, "DCGM_FI_DEV_FB_FREE"]
    assert all("[3600s:300s]" in p for p in parts)


# Label values PromQL strings and regular expressions must escape, and values each would match if it
# did not (a newline read as "n", an unescaped dot or alternation, a backslash-n taken for a newline).
ODD_UUIDS = (
    "GPU-a\nb",
    "GPU-\r\n",
    'GPU-"quoted"',
    "GPU-back\\slash",
    "GPU-a\\nb",
    "GPU-tab\tvtab\vff\f",
    "GPU-\x01\x1f\x7f",
    "GPU-a.1",
    "GPU-(x)|y",
    "GPU-ünï",
)
NEAR_MISSES = ("GPU-anb", "GPU-a\n", "GPU-ab", "GPU-a11", "y", "GPU-x", "GPU-back", "", "GPU-a\\\nb")

# The escapes of a double-quoted PromQL string (Prometheus' promql/parser/lex.go, lexEscape), as its
# parser unquotes them (Go's strconv.Unquote).
_PROMQL_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def promql_string_value(literal: str) -> str:
    """What Prometheus reads from a double-quoted PromQL string; ValueError where its lexer refuses it
    (an unescaped quote or newline, an unknown escape). Octal and hexadecimal byte escapes are bytes in
    Go: only ASCII ones are taken."""
    if len(literal) < 2 or literal[0] != '"' or literal[-1] != '"':
        raise ValueError(f"not a double-quoted string: {literal!r}")
    body, out, i = literal[1:-1], [], 0
    while i < len(body):
        char = body[i]
        if char in '"\n':
            raise ValueError(f"unescaped {char!r} at {i}: the string ends there, unterminated")
        if char != "\\":
            out.append(char)
            i += 1
            continue
        escape = body[i + 1 : i + 2]
        if escape in _PROMQL_ESCAPES:
            out.append(_PROMQL_ESCAPES[escape])
            i += 2
        elif escape in ('"', "\\"):
            out.append(escape)
            i += 2
        elif escape and escape in "01234567xuU":
            digits, base = (body[i + 1 : i + 4], 8) if escape in "01234567" else (None, 16)
            if digits is None:
                width = {"x": 2, "u": 4, "U": 8}[escape]
                digits = body[i + 2 : i + 2 + width]
                if len(digits) != width:
                    raise ValueError(f"escape sequence not terminated at {i}")
            value = int(digits, base)
            if escape in "01234567x" and value > 0x7F:
                raise ValueError(f"a byte escape beyond ASCII at {i}")
            out.append(chr(value))
            i += 1 + len(digits) + (escape not in "01234567")
        else:
            raise ValueError(f"unknown escape sequence {escape!r} at {i}")
    return "".join(out)


def test_promql_string_value_reads_as_prometheus_reads() -> None:
    assert promql_string_value(r'"a\nb\\c\"d\x41\101\u00e9\U0001F600"') == 'a\nb\\c"dAAé\U0001f600'
    for refused in ('"a\nb"', '"a"b"', r'"a\qb"', r'"\x4"', r'"\xff"', "'a'"):
        with pytest.raises(ValueError):
            promql_string_value(refused)


def test_the_late_query_s_uuid_regex_is_a_promql_string_that_matches_exactly_its_uuids() -> None:
    """Each UUID selector is a PromQL string Prometheus reads (a raw newline would end it unterminated)
    holding an RE2 alternation matched against the whole label value: every UUID given, nothing else."""
    expr = late_query(TelemetryConfig(), [3600], {"UUID": set(ODD_UUIDS)})
    literals = re.findall(r'UUID=~("(?:[^"\\]|\\.)*")', expr, flags=re.DOTALL)
    assert len(literals) == 3  # one per metric
    assert len(set(literals)) == 1
    assert "\n" not in expr and "\r" not in expr
    pattern = promql_string_value(literals[0])
    for value in ODD_UUIDS:
        assert re.fullmatch(pattern, value), value
    for value in NEAR_MISSES:
        assert not re.fullmatch(pattern, value), value


def test_the_late_query_needs_uuids() -> None:
    """No UUID to look up is the caller's to check (it sends no query then): an empty query is no
    answer. A UUID label given no values selects nothing rather than every series without it."""
    nothings: tuple[Mapping[str, Collection[str]], ...] = (
        {},
        {"UUID": set()},
        {"UUID": set(), "uuid": frozenset()},
    )
    for nothing in nothings:
        with pytest.raises(ValueError, match="no UUID"):
            late_query(TelemetryConfig(), [3600], nothing)
    expr = late_query(TelemetryConfig(), [3600], {"UUID": {"GPU-a"}, "uuid": set()})
    assert "uuid=~" not in expr
    assert len(expr.split(" or ")) == 3


def test_every_query_is_evaluated_at_now_with_a_server_side_timeout(stub_prometheus: StubFactory) -> None:
    stub = stub_prometheus()
    src = source(stub.url, timeout="3s")
    telemetry, _ = src.telemetry(NOW.replace(microsecond=123456), PODS)
    assert len(stub.requests) == len(src.plan)
    assert {r["time"] for r in stub.requests} == {f"{int(NOW.timestamp())}.123"}
    assert {r["timeout"] for r in stub.requests} == {"3s"}
    assert {h["accept-encoding"] for h in stub.headers} == {"identity"}  # 9 MB answers: no gzip CPU
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


def test_a_nan_utilisation_sum_makes_the_gpu_unusable_never_idle(stub_prometheus: StubFactory) -> None:
    t0 = NOW.timestamp()
    stub = stub_prometheus(
        responder=plan_responder(
            {
                ("count", UTIL): [(LABELS, 30.0)],
                ("sum", UTIL): [(LABELS, math.nan)],
                ("max", UTIL): [(LABELS, 3.0)],
                ("ts", UTIL): [(LABELS, t0)],
                ("last", USED): [(LABELS, 100.0)],
                ("ts", USED): [(LABELS, t0)],
            }
        )
    )
    telemetry, findings = source(stub.url).telemetry(NOW, PODS)
    window = telemetry.window(1800)
    assert window is not None
    assert window.gpus == ()  # no row at all: the GPU has no telemetry, so nothing reads it as idle
    (bad,) = findings
    assert bad.kind == "bad-telemetry"
    assert (bad.node, bad.gpu, bad.pod) == ("gpu-a-1", UUID, "p")
    assert "DCGM_FI_DEV_GPU_UTIL" in bad.detail and "over 30m" in bad.detail
    assert "sum nan is NaN" in bad.detail


def test_an_infinite_sum_makes_the_gpu_unusable_never_idle(stub_prometheus: StubFactory) -> None:
    """Prometheus writes infinities as "+Inf" and "-Inf": read as numbers, and refused as aggregates."""
    t0 = NOW.timestamp()
    table = {
        ("count", UTIL): [(LABELS, 30.0)],
        ("sum", UTIL): [(LABELS, math.inf)],
        ("max", UTIL): [(LABELS, 3.0)],
        ("ts", UTIL): [(LABELS, t0)],
    }
    stub = stub_prometheus(responder=plan_responder(table))
    (asks_sum,) = [q.expr for q in query_plan(TelemetryConfig(), [1800]) if q.aggregate == "sum"]
    assert b'"+Inf"' in plan_responder(table)({"query": asks_sum})[1]  # as Prometheus writes it
    telemetry, findings = source(stub.url).telemetry(NOW, PODS)
    window = telemetry.window(1800)
    assert window is not None and window.gpus == ()
    (bad,) = findings
    assert bad.kind == "bad-telemetry" and "sum inf is NaN, infinite" in bad.detail


def test_label_sets_quiet_beyond_the_lookback_are_looked_up_in_one_post(stub_prometheus: StubFactory) -> None:
    """A hundred GPUs whose exporter went quiet 10 minutes ago: one more query, for those GPUs only, too
    long for a URL, so sent as a form-encoded POST; their rows' newest sample is its answer."""
    t0 = NOW.timestamp()
    quiet = [{**LABELS, "UUID": f"GPU-{n:08d}-2222-3333-4444-555555555555", "gpu": "0"} for n in range(100)]
    table = {
        ("count", UTIL): [(labels, 20.0) for labels in quiet],
        ("sum", UTIL): [(labels, 40.0) for labels in quiet],
        ("max", UTIL): [(labels, 3.0) for labels in quiet],
    }
    answers = plan_responder(table)

    def respond(params: dict[str, str]) -> Answer:
        if params["query"].startswith("label_replace("):  # the late query
            return vector([({**labels, "rebalancer_metric": UTIL}, t0 - 600) for labels in quiet])
        return answers(params)

    stub = stub_prometheus(responder=respond)
    src = source(stub.url)
    telemetry, _ = src.telemetry(NOW, None)
    assert stub.methods == ["GET"] * len(src.plan) + ["POST"]
    late = stub.requests[-1]
    assert late["time"] == stub.requests[0]["time"]
    # Each quiet GPU by its UUID (regex-escaped, in a PromQL string), in every metric's part.
    assert all(late["query"].count(labels["UUID"].replace("-", r"\\-")) == 3 for labels in quiet)
    window = telemetry.window(1800)
    assert window is not None and len(window.gpus) == 100
    assert {row.newest_sample for row in window.gpus} == {NOW - timedelta(minutes=10)}


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
        responder=plan_responder(
            {
                ("count", UTIL): [(no_uuid, 30.0), (no_node, 30.0)],
                ("sum", UTIL): [(no_uuid, 1.0), (no_node, 1.0)],
                ("max", UTIL): [(no_uuid, 1.0), (no_node, 1.0)],
                ("ts", UTIL): [(no_uuid, t0), (no_node, t0)],
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
    assert "HTTP 500: boom" in problem
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


def test_bearer_token_from_file_is_read_on_every_call(tmp_path: Path, secure_stub: SecureStub) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    stub, ca = secure_stub()
    src = source(stub.url, bearer_token_file=str(token), ca_file=ca)
    src.telemetry(NOW, PODS)
    token.write_text("rotated")
    src.telemetry(NOW, PODS)
    auth = [r["authorization"] for r in stub.headers]
    assert auth[0] == "Bearer first"
    assert auth[-1] == "Bearer rotated"


def test_bearer_token_from_env_and_missing_secrets(tmp_path: Path, secure_stub: SecureStub) -> None:
    stub, ca = secure_stub()
    conn = PrometheusConfig(url=stub.url, bearer_token_env="PROM_TOKEN", ca_file=ca)
    src = PrometheusTelemetrySource(TelemetryConfig(prometheus=conn), [1800], environ={"PROM_TOKEN": "s3"})
    src.telemetry(NOW, PODS)
    assert stub.headers[0]["authorization"] == "Bearer s3"
    count = len(stub.requests)

    missing = PrometheusTelemetrySource(TelemetryConfig(prometheus=conn), [1800], environ={})
    assert "PROM_TOKEN is not set" in unavailable(missing.telemetry(NOW, PODS))
    gone = source(stub.url, bearer_token_file=str(tmp_path / "nope"), ca_file=ca)
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


SecureStub = Callable[..., "tuple[StubPrometheus, str]"]


@pytest.fixture
def secure_stub(certificate: tuple[Path, Path], stub_prometheus: StubFactory) -> SecureStub:
    """`secure_stub(**stub_kwargs)` -> an HTTPS stub and the CA file that trusts it (credentials need it)."""
    cert, key = certificate

    def make(**kwargs: object) -> tuple[StubPrometheus, str]:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        return stub_prometheus(tls=context, **kwargs), str(cert)

    return make


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


# --------------------------------------------------------------------------- partial answers


def envelope(**extra: object) -> Callable[[dict[str, str]], Answer]:
    """Every query answers an empty success vector with these envelope fields added."""
    body = {"status": "success", "data": {"resultType": "vector", "result": []}, **extra}
    return lambda _params: (200, json.dumps(body).encode())


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"warnings": ["PromQL warning: partial response from store 10.0.0.7:10901"]}, "warnings: PromQL"),
        ({"infos": ["the answer is a partial response (1 of 3 stores down)"]}, "infos: the answer"),
        ({"isPartial": True}, "isPartial: true"),
    ],
)
def test_a_partial_answer_makes_the_whole_cycle_unavailable(
    stub_prometheus: StubFactory, extra: dict[str, object], said: str
) -> None:
    partial_once = {"n": 0}

    def respond(params: dict[str, str]) -> Answer:
        partial_once["n"] += 1
        if partial_once["n"] == 3:  # one query of the cycle, not the first
            return envelope(**extra)(params)
        return plan_responder({("last", USED): [(LABELS, 100.0)]})(params)

    stub = stub_prometheus(responder=respond)
    problem = unavailable(source(stub.url).telemetry(NOW, PODS))
    assert "partial answer" in problem and said in problem
    assert "whole cycle's telemetry is unusable" in problem
    assert len(stub.requests) == 3  # nothing after the partial answer is asked


def test_infos_that_do_not_say_partial_and_empty_warnings_are_fine(stub_prometheus: StubFactory) -> None:
    info = "PromQL info: metric might not be a counter, name does not end in _total"
    t0 = NOW.timestamp()
    answers = plan_responder(
        {
            ("count", UTIL): [(LABELS, 30.0)],
            ("sum", UTIL): [(LABELS, 60.0)],
            ("max", UTIL): [(LABELS, 3.0)],
            ("ts", UTIL): [(LABELS, t0)],
        }
    )

    def respond(params: dict[str, str]) -> Answer:
        status, body = answers(params)
        parsed = json.loads(body)
        return status, json.dumps({**parsed, "infos": [info], "warnings": []}).encode()

    stub = stub_prometheus(responder=respond)
    telemetry, _ = source(stub.url).telemetry(NOW, PODS)
    window = telemetry.window(1800)
    assert window is not None
    (row,) = window.gpus
    assert (row.util_avg_percent, row.util_samples) == (2.0, 30)


def test_an_error_status_in_a_200_answer_is_unavailable(stub_prometheus: StubFactory) -> None:
    body = json.dumps(
        {"status": "error", "errorType": "execution", "error": "query processing would load too many samples"}
    )
    stub = stub_prometheus(responder=lambda _p: (200, body.encode()))
    problem = unavailable(source(stub.url).telemetry(NOW, PODS))
    assert "too many samples" in problem


# --------------------------------------------------------------------------- deadlines


class TrickleServer:
    """Answers every request with a valid empty vector, its body sent one byte every `every` seconds."""

    def __init__(self, every: float = 1.0) -> None:
        self.every = every
        self.requests = 0
        self._stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests += 1
                _, body = vector([])
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.flush()
                    for byte in body:
                        if server._stop.wait(server.every):
                            return
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                except OSError:
                    return  # the client gave up

            def log_message(self, format: str, *args: object) -> None:
                return

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def stop(self) -> None:
        self._stop.set()
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture
def trickle() -> Iterator[TrickleServer]:
    server = TrickleServer(every=1.0)
    try:
        yield server
    finally:
        server.stop()


def test_a_trickling_answer_ends_at_the_request_timeout(trickle: TrickleServer) -> None:
    src = source(trickle.url, timeout="2s", retries=0)
    started = time.monotonic()
    problem = unavailable(src.telemetry(NOW, PODS))
    elapsed = time.monotonic() - started
    assert "timed out" in problem
    assert trickle.requests == 1
    assert 1.9 <= elapsed < 2.8  # a byte every second kept each socket read alive, never the request


def test_a_trickling_answer_ends_at_the_cycle_deadline(trickle: TrickleServer) -> None:
    src = source(trickle.url, timeout="10s", retries=2, deadline="3s")
    started = time.monotonic()
    problem = unavailable(src.telemetry(NOW, PODS))
    elapsed = time.monotonic() - started
    assert "3s deadline" in problem and "telemetry.prometheus.deadline" in problem
    assert 2.9 <= elapsed < 3.8


def test_a_slow_but_valid_prometheus_is_cut_at_the_deadline_never_partial(
    stub_prometheus: StubFactory,
) -> None:
    stub = stub_prometheus(responder=plan_responder({("last", USED): [(LABELS, 100.0)]}), delay=0.4)
    src = source(stub.url, timeout="5s", deadline="2s")
    started = time.monotonic()
    problem = unavailable(src.telemetry(NOW, PODS))
    elapsed = time.monotonic() - started
    assert "2s deadline" in problem
    assert elapsed < 2.8
    assert len(stub.requests) < len(src.plan)
    # Each request was given only what was left of the budget, as its server-side timeout too.
    given = [int(r["timeout"].removesuffix("ms")) for r in stub.requests]
    assert 1900 <= given[0] <= 2000
    assert given == sorted(given, reverse=True) and given[-1] < 1000


def test_the_deadline_is_a_positive_duration_with_a_default_inside_the_cycle_interval() -> None:
    conn = PrometheusConfig(url="https://p:9090")
    assert conn.deadline == 30
    assert parse_policy({}).policy.interval > conn.deadline
    assert PrometheusConfig(url="https://p:9090", deadline="1m").deadline == 60
    with pytest.raises(ValueError, match="greater than 0"):
        PrometheusConfig(url="https://p:9090", deadline=0)


# --------------------------------------------------------------------------- credentials


def test_plain_http_with_credentials_is_a_policy_error_naming_the_field() -> None:
    for settings in (
        {"bearer_token_file": "/etc/prometheus/token"},
        {"bearer_token_env": "PROM_TOKEN"},
        {},
    ):
        url = "http://prometheus:9090" if settings else "http://bob:hunter2@prometheus:9090"
        doc = {"telemetry": {"prometheus": {"url": url, **settings}}}
        with pytest.raises(PolicyError) as caught:
            parse_policy(doc, source="policy.yaml")
        (problem,) = caught.value.problems
        assert problem.startswith("policy.yaml: telemetry.prometheus: url is plain http://")
        assert "use an https:// url" in problem
        assert "hunter2" not in problem
    # https, or plain http without credentials, stay valid.
    parse_policy({"telemetry": {"prometheus": {"url": "https://p:9090", "bearer_token_env": "T"}}})
    parse_policy({"telemetry": {"prometheus": {"url": "http://p:9090/path@x"}}})


def test_the_policy_error_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("telemetry:\n  prometheus:\n    url: http://p:9090\n    bearer_token_env: T\n")
    assert main(["validate", str(policy)]) == 2
    err = capsys.readouterr().err
    assert "telemetry.prometheus: url is plain http://" in err
    assert "Traceback" not in err


def service_account(tmp_path: Path, token: str = "sa-token-of-the-pod") -> Path:
    path = tmp_path / "serviceaccount" / "token"
    path.parent.mkdir()
    path.write_text(token + "\n")
    return path


def test_default_service_account_token_path_is_the_kubelet_mount() -> None:
    assert str(SERVICE_ACCOUNT_TOKEN) == "/var/run/secrets/kubernetes.io/serviceaccount/token"


def test_the_pods_service_account_token_is_never_sent_by_default(
    tmp_path: Path, secure_stub: SecureStub
) -> None:
    stub, ca = secure_stub()
    account = service_account(tmp_path)
    link = tmp_path / "innocent-looking"
    link.symlink_to(account)
    copy = tmp_path / "copy"
    copy.write_text("sa-token-of-the-pod")
    cases: list[tuple[dict[str, object], dict[str, str], str]] = [
        ({"bearer_token_file": str(account)}, {}, "bearer_token_file"),
        ({"bearer_token_file": str(link)}, {}, "bearer_token_file"),
        ({"bearer_token_file": str(copy)}, {}, "bearer_token_file"),
        ({"bearer_token_env": "PROM_TOKEN"}, {"PROM_TOKEN": "sa-token-of-the-pod"}, "bearer_token_env"),
    ]
    for settings, environ, setting in cases:
        conn = PrometheusConfig.model_validate({"url": stub.url, "ca_file": ca, **settings})
        src = PrometheusTelemetrySource(
            TelemetryConfig(prometheus=conn), [1800], environ=environ, service_account_token=account
        )
        problem = unavailable(src.telemetry(NOW, PODS))
        assert f"telemetry.prometheus.{setting}" in problem
        assert "service-account token" in problem
        assert "--allow-service-account-token" in problem
        assert "sa-token-of-the-pod" not in problem
    assert stub.requests == []  # refused before anything was sent

    allowed = PrometheusTelemetrySource(
        TelemetryConfig(prometheus=PrometheusConfig(url=stub.url, ca_file=ca, bearer_token_file=str(link))),
        [1800],
        service_account_token=account,
        allow_service_account_token=True,
    )
    allowed.telemetry(NOW, PODS)
    assert stub.headers[0]["authorization"] == "Bearer sa-token-of-the-pod"


def test_another_token_is_sent_when_a_service_account_token_exists(
    tmp_path: Path, secure_stub: SecureStub
) -> None:
    stub, ca = secure_stub()
    account = service_account(tmp_path)
    token = tmp_path / "prometheus-token"
    token.write_text("a-token-for-prometheus")
    conn = PrometheusConfig(url=stub.url, ca_file=ca, bearer_token_file=str(token))
    src = PrometheusTelemetrySource(TelemetryConfig(prometheus=conn), [1800], service_account_token=account)
    src.telemetry(NOW, PODS)
    assert stub.headers[0]["authorization"] == "Bearer a-token-for-prometheus"


# --------------------------------------------------------------------------- redaction


def test_credentials_in_the_url_never_reach_problems_or_findings(secure_stub: SecureStub) -> None:
    host = ""

    def echo(_params: dict[str, str]) -> Answer:
        # A proxy that quotes the upstream URL it was given, credentials and all.
        error = f"upstream https://bob:hunter2@{host}/api/v1/query refused"
        return 400, json.dumps({"status": "error", "errorType": "bad_data", "error": error}).encode()

    stub, ca = secure_stub(responder=echo)
    host = stub.url.removeprefix("https://")
    src = source(f"https://bob:hunter2@{host}", ca_file=ca)
    telemetry, findings = src.telemetry(NOW, PODS)
    text = f"{telemetry.problem} {[f.detail for f in findings]}"
    assert "refused" in text and f"https://***@{host}" in text
    assert "hunter2" not in text
    assert stub.headers[0]["authorization"].startswith("Basic ")  # it was used, only never shown


def cluster_objects() -> list[dict[str, Any]]:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "gpu-a-1", "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
        "status": {
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "4"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    started = "2026-11-28T12:00:00Z"
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "p-rs", "uid": "x", "controller": True}
    pod_obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ml",
            "uid": "uid-p",
            "creationTimestamp": started,
            "ownerReferences": [owner],
        },
        "spec": {
            "nodeName": "gpu-a-1",
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Running", "startTime": started},
    }
    return [node, pod_obj]


@pytest.mark.parametrize("output", ["json", "text"])
def test_rebalancer_once_never_shows_url_credentials(
    tmp_path: Path, secure_stub: SecureStub, capsys: pytest.CaptureFixture[str], output: str
) -> None:
    stub, _ca = secure_stub()  # a certificate the rebalancer is not told to trust: the query fails
    url = stub.url.replace("https://", "https://bob:hunter2@")
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "strategies": [{"name": "idle-gpu"}, {"name": "gpu-consolidation"}],
                "telemetry": {"prometheus": {"url": url, "retries": 0}},
            }
        )
    )
    with FakeApiServer() as api:
        for obj in cluster_objects():
            api.add(obj)
        config = tmp_path / "kubeconfig"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
                    "users": [{"name": "tester", "user": {"token": "t"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
                    "current-context": "fake",
                }
            )
        )
        code = main(["once", "--policy", str(policy), "--kubeconfig", str(config), "--output", output])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "telemetry-unavailable" in out or "telemetry unavailable" in out
    assert "***@127.0.0.1" in out
    assert "hunter2" not in out and "hunter2" not in err
