"""`rebalancer waste`: idle GPU-hours and their cost per team over a period, from DCGM history.

Owns the command's flags and its wiring, and nothing of the counting (`rebalancer.waste`) or the
rendering (`rebalancer.waste_report`):

- the policy (`--policy`, default the built-in one): the idle-gpu strategy's `max_utilization_percent`
  (its arguments in the policy, even when disabled there, else the strategy's defaults), the telemetry
  metric and label names, the Prometheus connection, the GPU prices (or `--prices FILE`, a YAML mapping
  of GPU model to USD per GPU-hour, keyed by `nvidia.com/gpu.product` or by DCGM's `modelName`);
- the history: Prometheus (`--prometheus-url` or `telemetry.prometheus.url`; one query for the whole
  period, `PrometheusTelemetrySource.idle_steps`), or, when no Prometheus is configured, the
  `.prom` / `.om` files of `--snapshot DIR` (`sources.snapshot_history`);
- the cluster view that maps pods to workloads and labels: `--snapshot DIR`, or the live cluster
  (`--kubeconfig`, `--context`, in-cluster config) when grouping by workload or label, or when a
  kubeconfig or context is named;
- the period: `--since` (default 7d) in `--step` steps (default 5m) ending at `--until` (RFC 3339), or
  at the snapshot's `now` when the history is the snapshot's, else at the clock's now.

The flags and inputs it shares with `rebalancer advise` (period, policy, history, cluster view) are
`rebalancer.history_command`'s.

Bad input (flags, policy, prices file, snapshot) raises `InputError` (exit 2), naming what is wrong and
where; Prometheus or the cluster failing raises `Problems` (exit 1). It must not count or render. The
Kubernetes and Prometheus clients are imported only when the live cluster or Prometheus is read: a
`--snapshot` run loads neither.
"""

from __future__ import annotations

import argparse
import sys

from rebalancer.errors import InputError, Problems
from rebalancer.history_command import (
    history_inputs,
    live_cluster,
    policy_price_of,
    prometheus_source,
    snapshot_history,
)
from rebalancer.policy import (
    LoadedPolicy,
)
from rebalancer.price_files import read_price_file
from rebalancer.redaction import redact
from rebalancer.registry import StrategyContext, get_strategy
from rebalancer.waste import (
    PriceOf,
    SeriesSteps,
    gpu_product,
    steps_from_samples,
    tally,
)
from rebalancer.waste_report import render
from rebalancer.wording import quoted

__all__ = ["run"]

IDLE_GPU = "idle-gpu"
DEFAULT_SINCE = "7d"
DEFAULT_STEP = "5m"


# --------------------------------------------------------------------------- inputs


def _threshold(loaded: LoadedPolicy) -> float:
    """The idle-gpu strategy's `max_utilization_percent` in this policy (enabled or not), else its default."""
    spec = get_strategy(IDLE_GPU)
    if spec is None:
        raise InputError([f"waste: the {IDLE_GPU} strategy is not installed"])
    entry = next((s for s in loaded.policy.strategies if s.name == IDLE_GPU), None)
    args = spec.args_model.model_validate(entry.args if entry is not None else {})
    value = getattr(args, "max_utilization_percent", None)
    if not isinstance(value, int | float):
        raise InputError([f"waste: the {IDLE_GPU} strategy has no max_utilization_percent"])
    return float(value)


def load_prices(path: str) -> dict[str, float]:
    """`--prices FILE` (`price_files`): GPU model -> USD per GPU-hour, keyed in `nvidia.com/gpu.product`
    form. Raises InputError naming the file, line and model of every problem, two spellings of one
    model with two prices included."""
    prices: dict[str, float] = {}
    problems: list[str] = []
    for price in read_price_file(path):
        key = gpu_product(price.model)
        if key in prices and prices[key] != price.per_gpu_hour:
            problems.append(
                f"{path}:{price.line}: {quoted(price.model)}: {key} is priced twice, "
                f"{prices[key]} and {price.per_gpu_hour}"
            )
            continue
        prices[key] = price.per_gpu_hour
    if problems:
        raise InputError(problems)
    return prices


def _price_of(loaded: LoadedPolicy, prices_file: str | None) -> PriceOf:
    """How the savings estimate prices a GPU (`StrategyContext.price_per_gpu_hour`), from `--prices`
    (no default price) or the policy's `prices`."""
    if prices_file is not None:
        return StrategyContext(gpu_prices=load_prices(prices_file)).price_per_gpu_hour
    return policy_price_of(loaded)


# --------------------------------------------------------------------------- running


def run(args: argparse.Namespace) -> int:
    """`rebalancer waste`; writes the table to stdout."""
    inputs = history_inputs(args, "waste")
    loaded, cfg, window = inputs.loaded, inputs.telemetry, inputs.window
    threshold = _threshold(loaded)
    price_of = _price_of(loaded, args.prices)
    cluster = inputs.snapshot
    if cluster is None and (args.by.needs_cluster or args.kubeconfig is not None or args.context is not None):
        cluster = live_cluster(args, loaded, inputs.now)
    steps: list[SeriesSteps]
    if inputs.prometheus is None:
        series = snapshot_history(inputs, (cfg.utilization.name,), cfg.utilization.name)
        steps = steps_from_samples(series, cfg, window, threshold)
    else:
        from rebalancer.sources.prometheus import PrometheusError

        try:
            steps = prometheus_source(inputs, args).idle_steps(window, threshold)
        except PrometheusError as exc:
            raise Problems([f"waste: {inputs.history}: {redact(str(exc))}"]) from None
    waste = tally(
        steps,
        cfg,
        window,
        threshold_percent=threshold,
        by=args.by,
        price_of=price_of,
        cluster=cluster,
        top=args.top,
        history=inputs.history,
    )
    sys.stdout.write(render(waste, args.output))
    return 0
