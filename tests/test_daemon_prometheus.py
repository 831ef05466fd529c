"""End to end: a real Prometheus scrapes the daemon's /metrics (the telemetry tests' harness)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pytest

from rebalancer.daemon.http import StatusServer
from rebalancer.daemon.loop import Clock, Daemon, DaemonSinks
from rebalancer.policy import NotifyConfig, parse_policy
from rebalancer.sinks.notify import Notifier
from tests.builders import A100, NOW, node, pod, snapshot

if TYPE_CHECKING:
    from rebalancer.model import Snapshot
    from tests.prometheus_server import PrometheusServer, ServerFactory

pytest_plugins = ["tests.prometheus_server"]
pytestmark = pytest.mark.prometheus

POLICY = parse_policy(
    {
        "strategies": [{"name": "gpu-consolidation", "args": {"max_utilization_percent": None}}],
        "telemetry": None,
        "prices": {"per_gpu_hour": {A100: 2.5}},
    }
)


def source(now: datetime, _loaded: object) -> Snapshot:
    return snapshot(
        [node("a-1"), node("a-2")],
        [pod("lonely", "a-1"), *(pod(f"busy-{i}", "a-2") for i in range(4))],
        now=now,
    )


def no_notifiers(_notify: NotifyConfig, _on_result: Callable[[str, str], None]) -> list[Notifier]:
    return []


def scrape_config(port: int) -> str:
    return (
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n"
        "  - job_name: gpu-rebalancer\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
    )


def value(server: PrometheusServer, expr: str) -> list[dict[str, Any]]:
    return server.query(expr, time.time())


def test_real_prometheus_scrapes_the_contract_metrics(prometheus_factory: ServerFactory) -> None:
    daemon = Daemon(POLICY, source, sinks=DaemonSinks(notifiers=no_notifiers), clock=Clock(wall=lambda: NOW))
    assert daemon.run_cycle() is not None
    http = StatusServer(daemon, "127.0.0.1", 0).start()
    try:
        prometheus = prometheus_factory()
        # The harness starts servers without scrape jobs; this one gets a job for the daemon.
        prometheus.config.write_text(scrape_config(http.port), encoding="utf-8")
        prometheus.start()
        deadline = time.monotonic() + 20
        while not value(prometheus, 'gpu_rebalancer_cycles_total{result="success"}'):
            assert time.monotonic() < deadline, "Prometheus never scraped the daemon"
            time.sleep(0.2)

        [up] = value(prometheus, 'up{job="gpu-rebalancer"}')
        assert up["value"][1] == "1"
        [cycles] = value(prometheus, 'gpu_rebalancer_cycles_total{result="success"}')
        assert cycles["metric"]["job"] == "gpu-rebalancer" and cycles["value"][1] == "1"
        [evictions] = value(prometheus, "gpu_rebalancer_evictions_total")
        assert {k: evictions["metric"][k] for k in ("strategy", "result", "mode")} == {
            "strategy": "gpu-consolidation",
            "result": "would-evict",
            "mode": "dry-run",
        }
        [freeable] = value(prometheus, "gpu_rebalancer_nodes_freeable")
        assert freeable["metric"]["gpu_model"] == A100 and freeable["value"][1] == "1"
        [savings] = value(prometheus, "gpu_rebalancer_estimated_savings_per_hour")
        assert float(savings["value"][1]) == 8 * 2.5
        assert value(prometheus, "gpu_rebalancer_cycle_duration_seconds_count")[0]["value"][1] == "1"
        assert value(prometheus, "gpu_rebalancer_last_success_timestamp_seconds")[0]["value"][1] == str(
            int(NOW.timestamp())
        )
        assert value(prometheus, "gpu_rebalancer_build_info")[0]["metric"]["version"]
    finally:
        http.stop()
        daemon.shutdown(notify_timeout=0)
