"""`rebalancer advise`: per workload, the cheaper GPU model, MIG slice or fewer GPUs it would fit.

Owns the command's wiring (its flags are `rebalancer.history_flags`'s, declared light so that `--help`
loads none of this), and nothing of the judging
(`strategies.gpu_rightsizing.advice`, the same path the strategy takes in a cycle) or the rendering
(`rebalancer.advise_report`):

- the period, policy, history and cluster view as `rebalancer waste` takes them
  (`rebalancer.history_command`): `--since` (default 7d) in `--step` steps (default 5m); the history from
  Prometheus (one query per metric for the whole cluster, `PrometheusTelemetrySource.usage`) or, without
  one, the `.prom` / `.om` files of `--snapshot DIR`; the cluster view (which pods make which workload,
  which GPU models the nodes have) from `--snapshot DIR` or the live cluster;
- the judgement's arguments: the policy's `gpu-rightsizing` entry (even when the policy does not run the
  strategy) else its defaults; its `window` and `step` give way to `--since` and `--step`; prices are
  the policy's.

Bad input raises `InputError` (exit 2); Prometheus or the cluster failing raises `Problems` (exit 1).
The Kubernetes and Prometheus clients are imported only when used: a `--snapshot` run loads neither.
"""

from __future__ import annotations

import argparse
import sys

from rebalancer.advise_report import render
from rebalancer.errors import Problems
from rebalancer.history_command import (
    history_inputs,
    live_cluster,
    policy_price_of,
    prometheus_source,
    snapshot_history,
)
from rebalancer.policy import LoadedPolicy
from rebalancer.redaction import redact
from rebalancer.usage import SeriesUsage, UsageHistory, usage_from_samples, usage_metrics
from strategies.gpu_rightsizing import NAME, GpuRightsizingArgs, advice

__all__ = ["run"]


def _rules(loaded: LoadedPolicy, window: int, step: int) -> GpuRightsizingArgs:
    """The policy's gpu-rightsizing arguments (its defaults when absent), over the command's period."""
    entry = next((s for s in loaded.policy.strategies if s.name == NAME), None)
    args = dict(entry.args) if entry is not None else {}
    return GpuRightsizingArgs.model_validate({**args, "window": window, "step": step})


def run(args: argparse.Namespace) -> int:
    """`rebalancer advise`; writes the recommendations to stdout."""
    inputs = history_inputs(args, "advise")
    cfg, window = inputs.telemetry, inputs.window
    rules = _rules(inputs.loaded, window.seconds, window.step)
    cluster = (
        inputs.snapshot if inputs.snapshot is not None else live_cluster(args, inputs.loaded, inputs.now)
    )
    series: list[SeriesUsage]
    if inputs.prometheus is None:
        names = tuple(metric.name for metric in usage_metrics(cfg).values())
        series = usage_from_samples(snapshot_history(inputs, names, cfg.fb_used.name), cfg, window)
    else:
        from rebalancer.sources.prometheus import PrometheusError

        try:
            series = prometheus_source(inputs, args).usage(window)
        except PrometheusError as exc:
            raise Problems([f"advise: {inputs.history}: {redact(str(exc))}"]) from None
    history = UsageHistory(period=window, series=tuple(series), source=inputs.history)
    found = advice(cluster, history, rules, policy_price_of(inputs.loaded))
    sys.stdout.write(render(found, history, args.output))
    return 0
