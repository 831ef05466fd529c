"""The inputs of the commands that read a period of DCGM history: `waste` and `advise`.

Owns what both take the same way, so they cannot drift apart:

- `history_inputs()`: the flags of `rebalancer.history_flags` (period, policy, history, cluster view)
  checked and resolved into the policy, the period (ending at `--until` (RFC 3339), or at the snapshot's
  `now` when the history is the snapshot's, else at the clock's now, `daemon.clock`, read once here), the
  Prometheus connection or the snapshot, and where the history is read (for the report, with the URL's
  credentials redacted);
- `policy_price_of()`: the policy's prices of one GPU of a model;
- `prometheus_source()`, `snapshot_history()` and `live_cluster()`: the edges, each imported only when
  used, so a `--snapshot` run loads neither the Kubernetes nor the Prometheus client.

Bad input raises `InputError` (exit 2) naming the command, the flag and what is wrong. It must not count,
judge or render anything.
"""

from __future__ import annotations

import argparse
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from rebalancer import rfc3339
from rebalancer.daemon.clock import utcnow
from rebalancer.errors import InputError
from rebalancer.model import Snapshot
from rebalancer.period import Period, check_steps, period
from rebalancer.policy import (
    LoadedPolicy,
    PrometheusConfig,
    TelemetryConfig,
    default_policy,
    format_duration,
    load_policy,
    prometheus_with_url,
)
from rebalancer.redaction import redact_url
from rebalancer.registry import StrategyContext
from rebalancer.rightsizing import PriceOf
from rebalancer.sources.files import load_snapshot_dir
from rebalancer.sources.snapshot_history import snapshot_series
from rebalancer.telemetry.exposition import Series
from rebalancer.telemetry.identity import resolve_preset
from rebalancer.waste import gpu_product

if TYPE_CHECKING:
    from rebalancer.sources.prometheus import PrometheusTelemetrySource

__all__ = [
    "HistoryInputs",
    "history_inputs",
    "live_cluster",
    "policy_price_of",
    "prometheus_source",
    "snapshot_history",
]


@dataclass(frozen=True)
class HistoryInputs:
    """The checked inputs of one run: the history is Prometheus' (`prometheus` set) or the snapshot's;
    `telemetry` with its preset resolved (the metric names the history holds)."""

    command: str
    loaded: LoadedPolicy
    telemetry: TelemetryConfig
    window: Period
    prometheus: PrometheusConfig | None
    snapshot: Snapshot | None
    snapshot_dir: Path | None
    now: datetime

    @property
    def history(self) -> str:
        """Where the history is read, for the report: never a credential."""
        if self.prometheus is not None:
            return f"Prometheus at {redact_url(self.prometheus.url)}"
        return f"snapshot {self.snapshot_dir}"


def _prometheus(command: str, cfg: TelemetryConfig, url: str) -> PrometheusConfig | None:
    """The policy's connection with `--prometheus-url`; InputError naming the flag for a bad URL."""
    return prometheus_with_url(cfg.prometheus, url, command)


def _until(command: str, text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return rfc3339.parse(text.strip())
    except ValueError as exc:
        raise InputError([f"{command}: --until: {exc}"]) from None


def history_inputs(args: argparse.Namespace, command: str) -> HistoryInputs:
    """The flags of `history_flags.add_history_arguments`, checked and resolved. Raises InputError."""
    now = utcnow()
    loaded = load_policy(args.policy) if args.policy else default_policy()
    cfg = loaded.policy.telemetry
    if cfg is None:
        raise InputError([f"{command}: telemetry is disabled in the policy (telemetry: null)"])
    if args.snapshot is not None and (args.kubeconfig is not None or args.context is not None):
        raise InputError(
            [f"{command}: --snapshot and --kubeconfig / --context name two cluster views: give one"]
        )
    if args.step < cfg.scrape_interval:
        raise InputError(
            [
                f"{command}: --step {format_duration(args.step)} is shorter than telemetry.scrape_interval "
                f"({format_duration(cfg.scrape_interval)}): steps without a sample would not be counted"
            ]
        )
    until = _until(command, args.until)
    conn = cfg.prometheus if args.prometheus_url is None else _prometheus(command, cfg, args.prometheus_url)
    if conn is None and args.snapshot is None:
        raise InputError(
            [
                f"{command}: no history: pass --prometheus-url URL, set telemetry.prometheus.url, or give "
                "--snapshot DIR holding DCGM history (.prom / .om files)"
            ]
        )
    try:
        check_steps(args.since, args.step)
    except ValueError as exc:
        raise InputError([f"{command}: --since / --step: {exc}"]) from None
    snapshot = load_snapshot_dir(Path(args.snapshot), loaded) if args.snapshot is not None else None
    if until is None:
        # The snapshot's history ends at its `now`; Prometheus' history at the clock's.
        until = snapshot.now if conn is None and snapshot is not None else now
    window = period(until, args.since, args.step)
    if window.start_ms < 0:
        raise InputError(
            [
                f"{command}: --until / --since: the period would start before 1970-01-01T00:00:00Z, older "
                "than any history"
            ]
        )
    return HistoryInputs(
        command=command,
        loaded=loaded,
        telemetry=resolve_preset(cfg),
        window=window,
        prometheus=conn,
        snapshot=snapshot,
        snapshot_dir=Path(args.snapshot) if args.snapshot is not None else None,
        now=now,
    )


def policy_price_of(loaded: LoadedPolicy) -> PriceOf:
    """How the policy's `prices` price one GPU of a model (`StrategyContext.price_per_gpu_hour`), keyed
    in `nvidia.com/gpu.product` form."""
    prices = loaded.policy.prices
    return StrategyContext(
        gpu_prices={gpu_product(k): v for k, v in prices.per_gpu_hour.items()},
        default_gpu_price=prices.default_per_gpu_hour,
    ).price_per_gpu_hour


def snapshot_history(inputs: HistoryInputs, metrics: Collection[str], needed: str) -> list[Series]:
    """The series of `metrics` in the snapshot directory's exposition files; InputError when none of
    them is the `needed` metric."""
    root = inputs.snapshot_dir
    assert root is not None
    series, files = snapshot_series(root, metrics)
    if not any(one.metric == needed for one in series):
        raise InputError([f"{inputs.command}: {root}: no {needed} series in {files} .prom / .om files"])
    return series


def prometheus_source(inputs: HistoryInputs, args: argparse.Namespace) -> PrometheusTelemetrySource:
    """The Prometheus source of the history (imports the client)."""
    from rebalancer.sources.prometheus import PrometheusTelemetrySource

    return PrometheusTelemetrySource(
        inputs.telemetry,
        (),
        prometheus=inputs.prometheus,
        allow_service_account_token=args.allow_service_account_token,
    )


def live_cluster(args: argparse.Namespace, loaded: LoadedPolicy, now: datetime) -> Snapshot:
    """The live cluster's view (imports the Kubernetes client)."""
    from rebalancer.kubeapi import load_api_client
    from rebalancer.sources.kube import KubeSource

    return KubeSource(load_api_client(args.kubeconfig, args.context), loaded).snapshot(now)
