"""The `rebalancer` command: parse arguments, wire sources, evictor and sinks, print, exit.

Owns the user-facing contract of the command line: exit 0 on success, 2 on bad input with one line
per problem on stderr and never a traceback. It holds no rebalancing logic: everything it runs lives
in cycle.py and the modules it wires.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from rebalancer import __version__, rfc3339
from rebalancer.cycle import run_cycle
from rebalancer.daemon.args import (
    add_live_once_arguments,
    add_run_arguments,
    add_service_account_token_argument,
)
from rebalancer.daemon.clock import utcnow
from rebalancer.daemon.wiring import run_command, run_live_once
from rebalancer.errors import InputError, Problems
from rebalancer.evictor import DryRunEvictor
from rebalancer.kubeapi import KubeConfigError, load_api_client
from rebalancer.policy import (
    LoadedPolicy,
    PolicyError,
    PrometheusConfig,
    default_policy,
    load_policy,
    parse_duration,
)
from rebalancer.reclaim import WorkloadWriter
from rebalancer.redaction import redact, redact_url
from rebalancer.registry import all_strategies
from rebalancer.report import OUTPUT_FORMATS, OutputFormat, render
from rebalancer.simulate import render as render_simulation
from rebalancer.simulate import run_simulation
from rebalancer.simulate.command import add_arguments as add_simulate_arguments
from rebalancer.simulate.command import options_from_args as simulate_options
from rebalancer.sources.files import SNAPSHOT_FILE, load_snapshot_dir
from rebalancer.sources.kube import KubeSource, KubeSourceError
from rebalancer.sources.prometheus import PrometheusError, PrometheusTelemetrySource
from rebalancer.telemetry.exposition import render_openmetrics
from rebalancer.telemetry.windows import LOOKBACK_SECONDS
from rebalancer.waste_command import add_arguments as add_waste_arguments
from rebalancer.waste_command import run as run_waste

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"rebalancer: error: {message}\n")


def _policy(path: str | None) -> LoadedPolicy:
    return load_policy(path) if path else default_policy()


# Flags of a live `once` that mean nothing for a snapshot, with what they would have done.
_LIVE_ONLY_FLAGS = (
    ("namespaces", "--namespace", "only restricts the pods listed from a live cluster"),
    ("kubeconfig", "--kubeconfig", "only points at a live cluster"),
    ("context", "--context", "only points at a live cluster"),
    ("prometheus_url", "--prometheus-url", "only reads live telemetry (a snapshot carries its own)"),
)


def _refuse_live_flags(args: argparse.Namespace) -> None:
    """`once --snapshot` with flags that would silently do nothing (or, --no-dry-run, the opposite)."""
    if args.dry_run is False:
        raise InputError(
            [
                "once --snapshot: --no-dry-run: a snapshot is a picture of the past, only ever "
                "evaluated in dry-run"
            ]
        )
    given = [
        (flag, what) for attribute, flag, what in _LIVE_ONLY_FLAGS if getattr(args, attribute) is not None
    ]
    if given:
        flags = ", ".join(flag for flag, _ in given)
        raise InputError([f"once --snapshot: {flags}: {given[0][1]}; remove it, or drop --snapshot"])


def cmd_once(args: argparse.Namespace) -> int:
    loaded = _policy(args.policy)
    if args.snapshot is None:
        # One live cycle against the cluster (e.g. as a CronJob): evicts unless dry-run.
        report = run_live_once(args, loaded)
        sys.stdout.write(render(report, args.output))
        return EXIT_OK
    _refuse_live_flags(args)
    snapshot = load_snapshot_dir(Path(args.snapshot), loaded)
    # A snapshot is a picture of the past: it is always evaluated in dry-run.
    report = run_cycle(snapshot, loaded, DryRunEvictor())
    fmt: OutputFormat = args.output
    sys.stdout.write(render(report, fmt))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """`rebalancer run`: the daemon (rebalancer.daemon); exit 0 after SIGTERM / SIGINT."""
    return run_command(args)


def cmd_validate(args: argparse.Namespace) -> int:
    problems: list[str] = []
    for path in args.policies:
        try:
            load_policy(path)
        except PolicyError as exc:
            problems.extend(exc.problems)
        else:
            print(f"{path}: valid")
    if problems:
        raise InputError(problems)
    return EXIT_OK


def cmd_strategies(_args: argparse.Namespace) -> int:
    for name, spec in all_strategies().items():
        print(f"{name}: {spec.summary}")
        for field_name, field in spec.args_model.model_fields.items():
            default = field.get_default(call_default_factory=True)
            described = f": {field.description}" if field.description else ""
            print(f"    {field_name} (default {default!r}){described}")
    return EXIT_OK


# ---- `rebalancer snapshot`: the snapshot directory format of DESIGN §4, from a live cluster and Prometheus

# The controllers behind the GPU pods (any kind of `workloads.KINDS`), so that a replay resolves the
# same workloads.
WORKLOADS_FILE = "workloads.json"
_CLUSTER_LISTS = (
    ("nodes.json", "NodeList", "v1", KubeSource.list_nodes),
    ("pods.json", "PodList", "v1", KubeSource.list_pods),
    ("pdbs.json", "PodDisruptionBudgetList", "policy/v1", KubeSource.list_pdbs),
)


def _snapshot_now(text: str | None) -> datetime:
    if text is None:
        moment = utcnow()
    else:
        try:
            moment = rfc3339.parse(text.strip())
        except ValueError as exc:
            raise InputError([f"snapshot: --now: {exc}"]) from None
    # Prometheus evaluates at millisecond precision; so does the snapshot.
    return moment.astimezone(UTC).replace(microsecond=moment.microsecond // 1000 * 1000)


def _capture_cluster(args: argparse.Namespace, loaded: LoadedPolicy, out: Path) -> None:
    """nodes.json / pods.json / pdbs.json as typed Lists, and workloads.json: a List of the controllers
    the GPU pods resolve through (a warning for each kind that could not be read); a warning (or, when
    asked for, an error) if not."""
    explicit = args.kubeconfig is not None or args.context is not None
    try:
        source = KubeSource(load_api_client(args.kubeconfig, args.context), loaded)
        lists: list[tuple[str, dict[str, Any]]] = [
            (name, {"apiVersion": version, "kind": kind, "items": list(read(source))})
            for name, kind, version, read in _CLUSTER_LISTS
        ]
        controllers, unread = source.list_controllers(dict(lists)["pods.json"]["items"])
        lists.append((WORKLOADS_FILE, {"apiVersion": "v1", "kind": "List", "items": controllers}))
        for finding in unread:
            print(f"rebalancer: warning: {finding.detail}", file=sys.stderr)
    except (KubeSourceError, KubeConfigError) as exc:
        if explicit:
            raise InputError([f"snapshot: {problem}" for problem in exc.problems]) from None
        print(
            f"rebalancer: warning: cluster objects not captured ({'; '.join(exc.problems)}); the snapshot "
            "holds telemetry only (add `kubectl get nodes,pods,pdb -A -o json` output to it, or pass "
            "--kubeconfig)",
            file=sys.stderr,
        )
        return
    for name, doc in lists:
        (out / name).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def cmd_snapshot(args: argparse.Namespace) -> int:
    loaded = _policy(args.policy)
    cfg = loaded.policy.telemetry
    if cfg is None:
        raise InputError(["snapshot: telemetry is disabled in the policy (telemetry: null)"])
    try:
        window = parse_duration(args.window)
        conn = cfg.prometheus
        if args.prometheus_url is not None:
            base = conn.model_dump() if conn is not None else {}
            conn = PrometheusConfig.model_validate({**base, "url": args.prometheus_url})
    except ValueError as exc:  # pydantic's ValidationError is a ValueError too
        detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise InputError([f"snapshot: {detail}"]) from None
    if conn is None:
        raise InputError(
            ["snapshot: no Prometheus: pass --prometheus-url URL or set telemetry.prometheus.url"]
        )
    now = _snapshot_now(args.now)
    windows = loaded.telemetry_windows() or frozenset({window})
    # Enough history for every window of the policy and for instant values (the 5m lookback).
    span = max(window, LOOKBACK_SECONDS, *windows)
    source = PrometheusTelemetrySource(
        cfg, windows, prometheus=conn, allow_service_account_token=args.allow_service_account_token
    )
    try:
        series = source.history(now, span)
    except PrometheusError as exc:
        print(
            f"rebalancer: error: snapshot: Prometheus at {redact_url(conn.url)}: {redact(str(exc))}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not args.telemetry_only:
            _capture_cluster(args, loaded, out)
        (out / "telemetry.om").write_text(render_openmetrics(series), encoding="utf-8")
        stamp = rfc3339.format_utc(now, "milliseconds")
        (out / SNAPSHOT_FILE).write_text(f"now: {stamp}\n", encoding="utf-8")
    except OSError as exc:
        raise InputError([f"snapshot: cannot write {out}: {exc.strerror or exc}"]) from None
    samples = sum(len(one.samples) for one in series)
    print(f"wrote {out}: {len(series)} series, {samples} samples over {span}s before {stamp}")
    return EXIT_OK


def cmd_simulate(args: argparse.Namespace) -> int:
    """Replay a GPU trace; wall time is measured here, at the edge, around the pure replay."""
    options = simulate_options(args)
    started = time.perf_counter()
    result = run_simulation(options)
    result = dataclasses.replace(result, wall_seconds=time.perf_counter() - started)
    sys.stdout.write(render_simulation(result, args.output))
    return EXIT_OK


def _restore_target(text: str) -> tuple[str, str, str]:
    parts = text.split("/")
    if len(parts) != 3 or not all(parts):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAMESPACE/KIND/NAME, e.g. notebooks/StatefulSet/alice"
        )
    namespace, kind, name = parts
    return namespace, kind, name


def cmd_restore(args: argparse.Namespace) -> int:
    """Undo reclaims from the record on each workload: replicas back, resumed, started again."""
    if (args.workload is None) == (not args.all_reclaimed):
        raise InputError(["restore: name one NAMESPACE/KIND/NAME, or pass --all-reclaimed (not both)"])
    writer = WorkloadWriter(load_api_client(args.kubeconfig, args.context), server_dry_run=args.dry_run)
    targets = [args.workload] if args.workload is not None else list(writer.reclaimed(args.namespace))
    if not targets:
        print("no reclaimed workload" + (f" in namespace {args.namespace}" if args.namespace else ""))
        return EXIT_OK
    failed = 0
    for namespace, kind, name in targets:
        done = writer.restore(namespace, kind, name)
        failed += not done.ok
        prefix = "server dry-run: " if args.dry_run else ""
        print(f"{prefix}{done.ref}: {done.detail}" if done.ok else f"{done.ref}: error: {done.detail}")
    return EXIT_FAILED if failed else EXIT_OK


def cmd_waste(args: argparse.Namespace) -> int:
    """`rebalancer waste`: idle GPU-hours and their cost per team over a period (rebalancer.waste)."""
    return run_waste(args)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rebalancer", description="A descheduler for GPU clusters.")
    parser.add_argument("--version", action="version", version=f"gpu-rebalancer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    once = sub.add_parser("once", help="run one cycle and print its report")
    once.add_argument("--snapshot", metavar="DIR", help="evaluate a snapshot directory (always dry-run)")
    once.add_argument("--policy", metavar="FILE", help="policy file (default: built-in safe policy)")
    once.add_argument(
        "--output",
        choices=OUTPUT_FORMATS,
        default="text",
        help="report format (html: one self-contained page)",
    )
    add_live_once_arguments(once)  # without --snapshot: one cycle against the live cluster
    once.set_defaults(func=cmd_once)

    run = sub.add_parser("run", help="the daemon: cycles every interval, leader election, /metrics")
    add_run_arguments(run)
    run.set_defaults(func=cmd_run)

    validate = sub.add_parser("validate", help="check policy files; exit 2 listing every problem")
    validate.add_argument("policies", nargs="+", metavar="POLICY")
    validate.set_defaults(func=cmd_validate)

    strategies = sub.add_parser("strategies", help="list the installed strategies and their arguments")
    strategies.set_defaults(func=cmd_strategies)

    snapshot = sub.add_parser(
        "snapshot", help="write a snapshot directory (cluster objects + DCGM history) for `once --snapshot`"
    )
    snapshot.add_argument("--out", metavar="DIR", required=True, help="directory to write (created)")
    snapshot.add_argument(
        "--window", default="30m", help="history to capture (at least the policy's windows)"
    )
    snapshot.add_argument(
        "--policy", metavar="FILE", help="policy file (metrics, labels, Prometheus settings)"
    )
    snapshot.add_argument("--prometheus-url", metavar="URL", help="overrides telemetry.prometheus.url")
    add_service_account_token_argument(snapshot)
    snapshot.add_argument("--now", metavar="RFC3339", help="the instant to capture (default: the clock)")
    snapshot.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig for the cluster objects")
    snapshot.add_argument("--context", help="kubeconfig context")
    snapshot.add_argument("--telemetry-only", action="store_true", help="do not capture cluster objects")
    snapshot.set_defaults(func=cmd_snapshot)

    restore = sub.add_parser(
        "restore", help="undo an idle-GPU reclaim (replicas back, resumed, started) from its annotations"
    )
    restore.add_argument(
        "workload",
        nargs="?",
        type=_restore_target,
        metavar="NAMESPACE/KIND/NAME",
        help="e.g. ml/Deployment/x",
    )
    restore.add_argument(
        "--all-reclaimed", action="store_true", help="every workload gpu-rebalancer reclaimed"
    )
    restore.add_argument("-n", "--namespace", help="with --all-reclaimed: only this namespace")
    restore.add_argument("--dry-run", action="store_true", help="server-side dry run: check, change nothing")
    restore.add_argument("--kubeconfig", metavar="FILE")
    restore.add_argument("--context", help="kubeconfig context")
    restore.set_defaults(func=cmd_restore)

    simulate = sub.add_parser("simulate", help="replay a GPU cluster trace and report node-hours")
    add_simulate_arguments(simulate)
    simulate.set_defaults(func=cmd_simulate)

    waste = sub.add_parser("waste", help="idle GPU-hours and their cost per team over a period")
    add_waste_arguments(waste)
    waste.set_defaults(func=cmd_waste)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except Problems as exc:
        for problem in exc.problems:  # a problem may quote a URL the operator gave, credentials and all
            print(f"rebalancer: error: {redact(problem)}", file=sys.stderr)
        return EXIT_BAD_INPUT if isinstance(exc, InputError) else EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
