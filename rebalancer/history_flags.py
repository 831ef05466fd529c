"""The flags of the commands that read a period of DCGM history (`waste`, `advise`), declared light.

Owns the flags only: the period (`--since`, `--until`, `--step`), the policy, the history
(`--prometheus-url`, or without one the `.prom` / `.om` files of `--snapshot DIR`; the service-account
token opt-in) and the cluster view (`--snapshot DIR`, or `--kubeconfig` / `--context` / in-cluster), and
each command's own (`waste`: `--by`, `--top`, `--prices`, `--output`; `advise`: `--output`). It imports no
model, source or policy module, so that `rebalancer --help` stays fast (tests/test_startup.py); what the
flags mean is `rebalancer.history_command`'s and each command's.
"""

from __future__ import annotations

import argparse

from rebalancer.daemon.args import add_service_account_token_argument
from rebalancer.digits import is_ascii_digits
from rebalancer.durations import parse_duration
from rebalancer.group_by import GroupBy
from rebalancer.wording import quoted

__all__ = [
    "DEFAULT_SINCE",
    "DEFAULT_STEP",
    "DEFAULT_TOP",
    "add_advise_arguments",
    "add_waste_arguments",
    "duration",
]

DEFAULT_SINCE = "7d"
DEFAULT_STEP = "5m"


def duration(text: str) -> int:
    """An argparse type: a positive duration (`90s`, `5m`, `7d`) in seconds."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive duration, got {quoted(text)}")
    return seconds


def add_history_arguments(parser: argparse.ArgumentParser, step_help: str) -> None:
    """The period, policy, history and cluster-view flags."""
    parser.add_argument(
        "--since",
        type=duration,
        default=duration(DEFAULT_SINCE),
        metavar="DURATION",
        help=f"the period, ending at --until (default {DEFAULT_SINCE})",
    )
    parser.add_argument(
        "--until", metavar="RFC3339", help="end of the period (default: now, or the snapshot's now)"
    )
    parser.add_argument(
        "--step",
        type=duration,
        default=duration(DEFAULT_STEP),
        metavar="DURATION",
        help=f"{step_help} (default {DEFAULT_STEP})",
    )
    parser.add_argument("--policy", metavar="FILE", help="policy file (default: built-in)")
    parser.add_argument(
        "--snapshot", metavar="DIR", help="cluster view (and, without Prometheus, history) from a snapshot"
    )
    parser.add_argument("--prometheus-url", metavar="URL", help="overrides telemetry.prometheus.url")
    add_service_account_token_argument(parser)
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig for the cluster view")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context")


DEFAULT_TOP = 5


def _group_by(text: str) -> GroupBy:
    try:
        return GroupBy.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _top(text: str) -> int:
    if not is_ascii_digits(text):
        raise argparse.ArgumentTypeError(f"expected a number of entries (0 or more), got {quoted(text)}")
    return int(text)


def add_waste_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `rebalancer waste`."""
    add_history_arguments(parser, "resolution: a step with a sample counts in full, one without not at all")
    parser.add_argument(
        "--by",
        type=_group_by,
        default=GroupBy(kind="namespace"),
        metavar="namespace|workload|label:KEY",
        help="rows of the table (default namespace); workload and label:KEY need a cluster view",
    )
    parser.add_argument(
        "--top",
        type=_top,
        default=DEFAULT_TOP,
        metavar="N",
        help=f"top idle workloads shown (default {DEFAULT_TOP})",
    )
    parser.add_argument("--prices", metavar="FILE", help="YAML mapping GPU model -> USD per GPU-hour")
    parser.add_argument(
        "-o", "--output", choices=("text", "json", "markdown", "csv"), default="text", help="report format"
    )


def add_advise_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `rebalancer advise`."""
    add_history_arguments(parser, "resolution: each step counts as its busiest sample")
    parser.add_argument(
        "-o", "--output", choices=("text", "json", "markdown"), default="text", help="report format"
    )
