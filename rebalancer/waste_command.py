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
import math
import sys
from pathlib import Path

import yaml

from rebalancer import yaml_input
from rebalancer.errors import InputError, Problems
from rebalancer.history_command import (
    history_inputs,
    live_cluster,
    policy_price_of,
    prometheus_source,
    snapshot_history,
)
from rebalancer.policy import (
    MAX_GPU_PRICE_PER_HOUR,
    LoadedPolicy,
)
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


def _key_lines(root: yaml.Node | None) -> dict[str, int]:
    if not isinstance(root, yaml.MappingNode):
        return {}
    return {k.value: k.start_mark.line + 1 for k, _ in root.value if isinstance(k, yaml.ScalarNode)}


def load_prices(path: str) -> dict[str, float]:
    """`--prices FILE`: GPU model -> USD per GPU-hour, keyed in `nvidia.com/gpu.product` form. Raises
    InputError naming the file, line and model of every problem."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise InputError([f"{path}: cannot read prices: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise InputError([f"{path}: not UTF-8 text ({exc.reason})"]) from None
    try:
        root, data = yaml_input.compose_and_load(text)
    except yaml.YAMLError as exc:
        line, problem = yaml_input.problem_of(exc, text)
        raise InputError([f"{path}:{line or 1}: YAML syntax error: {problem}"]) from None
    if not isinstance(data, dict) or not data:
        got = "nothing" if data is None or data == {} else f"a {type(data).__name__}"
        raise InputError(
            [f"{path}:1: expected a mapping of GPU model to USD per GPU-hour (NVIDIA-L4: 1.15), got {got}"]
        )
    lines = _key_lines(root)
    problems: list[str] = []
    prices: dict[str, float] = {}
    for model, value in data.items():
        where = f"{path}:{lines.get(str(model), 1)}: {quoted(model)}"
        if not isinstance(model, str) or not model.strip():
            problems.append(f"{where}: a GPU model must be a non-empty string")
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            problems.append(f"{where}: expected USD per GPU-hour (a number), got {quoted(value)}")
            continue
        if not 0 <= value <= MAX_GPU_PRICE_PER_HOUR:
            problems.append(f"{where}: a price must be from 0 to {MAX_GPU_PRICE_PER_HOUR} USD per GPU-hour")
            continue
        key = gpu_product(model)
        if key in prices and prices[key] != value:
            problems.append(f"{where}: {key} is priced twice, {prices[key]} and {value}")
            continue
        prices[key] = float(value)
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
