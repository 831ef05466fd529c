"""The command-line options of `rebalancer run` and of a live `rebalancer once`.

Owns the flags, their defaults and help texts, and the parsing of their values (durations, HOST:PORT,
`off`). It must not act on them: `daemon.wiring` does.
"""

from __future__ import annotations

import argparse

from rebalancer.daemon.names import DEFAULT_LEASE_NAME, STATE_CONFIGMAP
from rebalancer.digits import is_ascii_digits
from rebalancer.durations import parse_duration

__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_REPORT_LISTEN",
    "add_live_once_arguments",
    "add_run_arguments",
    "add_service_account_token_argument",
]

DEFAULT_LISTEN = ("0.0.0.0", 8080)
# The last report names pods, nodes and workloads: loopback only, reached with `kubectl port-forward`.
DEFAULT_REPORT_LISTEN = ("127.0.0.1", 8081)


def _seconds(text: str) -> float:
    try:
        return float(parse_duration(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not is_ascii_digits(port) or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT or :PORT, got {text!r}")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def _report_listen(text: str) -> tuple[str, int] | None:
    return None if text == "off" else _listen(text)


def _add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry-run",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="report only (--dry-run) or evict (--no-dry-run); default: the policy's dry_run",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster, then ~/.kube)")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context")
    parser.add_argument(
        "--prometheus-url", metavar="URL", help="Prometheus for GPU telemetry (overrides the policy's)"
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        dest="namespaces",
        action="append",
        metavar="NS",
        help=(
            "only list pods of this namespace (repeatable; free capacity may then be overstated, and GPU "
            "series of other namespaces' pods are taken as their labels say)"
        ),
    )
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="list the pods of every namespace (what happens without -n too)",
    )
    parser.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default="auto",
        help="log lines on stderr (auto: console on a terminal, else JSON)",
    )
    add_service_account_token_argument(parser)


def add_service_account_token_argument(parser: argparse.ArgumentParser) -> None:
    """`--allow-service-account-token`, for every command that reads Prometheus."""
    parser.add_argument(
        "--allow-service-account-token",
        action="store_true",
        help="let the policy's Prometheus bearer token be this pod's Kubernetes service-account token "
        "(default: refused, that token is a credential for the cluster, not for Prometheus)",
    )


def add_live_once_arguments(parser: argparse.ArgumentParser, *, memory: bool = False) -> None:
    """The options `rebalancer once` needs without --snapshot (one live cycle, e.g. as a CronJob); with
    `memory`, where a live run keeps the daemon's memory (what `explain`, always dry, has no use for)."""
    _add_cluster_arguments(parser)
    if memory:
        where = _add_memory_arguments(parser, where="the namespace of --state-namespace")
        where.add_argument(
            "--state-namespace",
            default=None,
            metavar="NS",
            help="the state ConfigMap's namespace (default: the pod's, as the daemon's; else `default`)",
        )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `rebalancer run`."""
    parser.add_argument(
        "--policy", metavar="FILE", help="policy file, re-read every cycle (default: built-in)"
    )
    _add_cluster_arguments(parser)
    parser.add_argument(
        "--listen",
        type=_listen,
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help="/metrics, /healthz, /readyz (default :8080)",
    )
    parser.add_argument(
        "--report-listen",
        type=_report_listen,
        default=DEFAULT_REPORT_LISTEN,
        metavar="HOST:PORT|off",
        help="/report and /report.html, the last report as JSON and as a page (default 127.0.0.1:8081: "
        "loopback, for kubectl "
        "port-forward; the --listen address: served there too; off: not served)",
    )
    parser.add_argument("--jitter", type=_seconds, default=None, help="random delay per cycle (default 10%%)")
    parser.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=30.0,
        metavar="DURATION",
        help="after SIGTERM, how long the decision in flight may go on writing (default 30s: keep it 15s "
        "or more under the pod's terminationGracePeriodSeconds, for the state save and the lease release)",
    )
    election = parser.add_argument_group("leader election (coordination.k8s.io/v1 Lease)")
    election.add_argument(
        "--no-leader-election",
        dest="leader_election",
        action="store_false",
        help="run without a Lease (only ever one replica, e.g. a local test)",
    )
    election.add_argument("--lease-name", default=DEFAULT_LEASE_NAME, help="the Lease object's name")
    election.add_argument("--lease-namespace", default=None, help="default: the pod's namespace")
    election.add_argument(
        "--identity", default=None, help="default: $POD_NAME or the hostname, plus a suffix"
    )
    election.add_argument(
        "--lease-duration",
        type=_seconds,
        default=15.0,
        metavar="DURATION",
        help="how long other candidates wait after the last renewal before taking the Lease (seconds)",
    )
    election.add_argument(
        "--renew-deadline",
        type=_seconds,
        default=10.0,
        metavar="DURATION",
        help="how long the leader keeps trying to renew before it stops acting (seconds)",
    )
    election.add_argument(
        "--retry-period",
        type=_seconds,
        default=2.0,
        metavar="DURATION",
        help="time between attempts to take or renew the Lease (seconds)",
    )
    election.add_argument(
        "--leader-margin",
        type=_seconds,
        default=2.0,
        metavar="DURATION",
        help="time left before the renew deadline that a decision needs to start (default 2s)",
    )
    _add_memory_arguments(parser, where="the Lease's namespace")


def _add_memory_arguments(parser: argparse.ArgumentParser, *, where: str) -> argparse._ArgumentGroup:
    """`--state-configmap` / `--state-file`: where a live run keeps the actuator's memory (the cooldowns,
    the disruption budget and the circuit breaker plan with it); the group, for more options."""
    memory = parser.add_argument_group(
        "actuator memory (cooldowns, disruption budget, circuit breaker, owned drains), kept across runs, "
        "restarts and leader changes"
    )
    choice = memory.add_mutually_exclusive_group()
    choice.add_argument(
        "--state-configmap",
        default=STATE_CONFIGMAP,
        metavar="NAME",
        help=f"a ConfigMap in {where} (default {STATE_CONFIGMAP}; unused with --dry-run)",
    )
    choice.add_argument(
        "--state-file", metavar="PATH", default=None, help="a JSON file instead (e.g. on a persistent volume)"
    )
    return memory
