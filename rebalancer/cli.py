"""The `rebalancer` command: parse arguments, wire sources, evictor and sinks, print, exit.

Owns the user-facing contract of the command line: exit 0 on success, 2 on bad input with one line
per problem on stderr and never a traceback. It holds no rebalancing logic: everything it runs lives
in cycle.py and the modules it wires.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import rebalancer
from rebalancer.daemon.args import (
    add_live_once_arguments,
    add_run_arguments,
    add_service_account_token_argument,
)
from rebalancer.errors import InputError, Problems
from rebalancer.gcpause import collector_paused
from rebalancer.history_flags import add_advise_arguments, add_waste_arguments
from rebalancer.redaction import redact
from rebalancer.simulate_command import add_arguments as add_simulate_arguments

if TYPE_CHECKING:
    from rebalancer.model import Snapshot
    from rebalancer.policy import LoadedPolicy

# Each command imports the edges it uses inside it (the Kubernetes client, the Prometheus HTTP client,
# the scheduler): `--help`, `validate`, `once --snapshot`, `simulate` and `waste --snapshot` never load
# what they do not use, and start fast. tests/test_startup.py holds each to it.

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_WOULD_ACT = 3  # `once --exit-code`: the cycle evicted or acted, or (dry run) would have


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's default at the end of its help, unless the help already says it or there is
    none to say (no default, a switch)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or not action.option_strings
            or action.nargs == 0  # a switch: its help says what it turns on or off
            or default is None
            or default is False
            or default is argparse.SUPPRESS  # --help, --version
        ):
            return text
        if isinstance(default, list | tuple):
            return f"{text} (default: {' '.join(str(item) for item in default)})"
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"rebalancer: error: {message}\n")


def terminal_width() -> int:
    """The terminal's columns (`COLUMNS` first), 100 when the output is no terminal."""
    return shutil.get_terminal_size((100, 24)).columns


def _policy(path: str | None) -> LoadedPolicy:
    from rebalancer.policy import default_policy, load_policy

    return load_policy(path) if path else default_policy()


# Flags of a live `once` that mean nothing for a snapshot, with what they would have done.
_LIVE_ONLY_FLAGS = (
    ("namespaces", "--namespace", "only restricts the pods listed from a live cluster"),
    ("kubeconfig", "--kubeconfig", "only points at a live cluster"),
    ("context", "--context", "only points at a live cluster"),
    ("prometheus_url", "--prometheus-url", "only reads live telemetry (a snapshot carries its own)"),
    ("state_file", "--state-file", "only keeps a live run's memory"),
    ("state_namespace", "--state-namespace", "only keeps a live run's memory"),
)


def _refuse_live_flags(args: argparse.Namespace, command: str = "once") -> None:
    """`once --snapshot` with flags that would silently do nothing (or, --no-dry-run, the opposite)."""
    if args.dry_run is False:
        raise InputError(
            [
                f"{command} --snapshot: --no-dry-run: a snapshot is a picture of the past, only ever "
                "evaluated in dry-run"
            ]
        )
    given = [
        (flag, what)
        for attribute, flag, what in _LIVE_ONLY_FLAGS
        if getattr(args, attribute, None) is not None
    ]
    if given:
        flags = ", ".join(flag for flag, _ in given)
        raise InputError([f"{command} --snapshot: {flags}: {given[0][1]}; remove it, or drop --snapshot"])


def _snapshot_dir(root: Path, loaded: LoadedPolicy) -> Snapshot:
    """A snapshot directory for a cycle, with the usage history its policy's strategies read."""
    from rebalancer.sources.files import load_snapshot_dir
    from rebalancer.sources.snapshot_history import with_directory_usage

    return with_directory_usage(load_snapshot_dir(root, loaded), root, loaded)


def cmd_once(args: argparse.Namespace) -> int:
    from rebalancer.report import OutputFormat, render

    loaded = _policy(args.policy)
    if args.snapshot is None:
        from rebalancer.daemon.wiring import run_live_once

        # One live cycle against the cluster (e.g. as a CronJob): evicts unless dry-run.
        report = run_live_once(args, loaded)
    else:
        from rebalancer.cycle import run_cycle
        from rebalancer.evictor import DryRunEvictor

        _refuse_live_flags(args)
        snapshot = _snapshot_dir(Path(args.snapshot), loaded)
        # A snapshot is a picture of the past: it is always evaluated in dry-run.
        report = run_cycle(snapshot, loaded, DryRunEvictor())
    fmt: OutputFormat = args.output
    sys.stdout.write(render(report, fmt, terminal_width()))
    return EXIT_WOULD_ACT if args.exit_code and report.acted else EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    """`rebalancer explain NODE|NAMESPACE/POD`: one dry cycle (on a snapshot, or live through the source
    `once` reads), then every strategy's and the planner's verdict on that node or pod."""
    from rebalancer.cycle import run_cycle
    from rebalancer.evictor import DryRunEvictor
    from rebalancer.explain import parse_subject, render_explanation

    try:
        subject = parse_subject(args.subject)
    except ValueError as exc:
        raise InputError([f"explain: {exc}"]) from None
    if args.dry_run is False:
        raise InputError(["explain: --no-dry-run: explain never evicts, its cycle is always dry"])
    loaded = _policy(args.policy)
    if args.snapshot is None:
        from rebalancer.daemon.clock import utcnow
        from rebalancer.daemon.wiring import live_snapshot

        snapshot = live_snapshot(args, loaded, utcnow())
    else:
        _refuse_live_flags(args, "explain")
        snapshot = _snapshot_dir(Path(args.snapshot), loaded)
    if subject.is_pod:
        pod = snapshot.pods_by_key.get((subject.namespace or "", subject.name))
        if pod is None:
            where = snapshot.source or "snapshot"
            raise InputError([f"explain: pod {subject.namespace}/{subject.name} is not in the {where}"])
        subject = dataclasses.replace(subject, node=pod.node_name)
    elif subject.name not in snapshot.nodes:
        raise InputError([f"explain: node {subject.name} is not in the {snapshot.source or 'snapshot'}"])
    # Explaining never evicts: the cycle is always dry, whatever the policy says.
    report = run_cycle(snapshot, loaded, DryRunEvictor())
    names = [configured.name for configured in loaded.strategies]
    sys.stdout.write(render_explanation(report, subject, names, args.output))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """`rebalancer run`: the daemon (rebalancer.daemon); exit 0 after SIGTERM / SIGINT."""
    from rebalancer.daemon.wiring import run_command

    return run_command(args)


def cmd_validate(args: argparse.Namespace) -> int:
    from rebalancer.policy import PolicyError, load_policy

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


def cmd_strategies(args: argparse.Namespace) -> int:
    """The installed strategies and their arguments, as text or as a pasteable policy fragment."""
    from rebalancer.registry import all_strategies
    from rebalancer.strategy_reference import policy_fragment, text_reference

    render_reference = policy_fragment if args.output == "yaml" else text_reference
    sys.stdout.write(render_reference(all_strategies()))
    return EXIT_OK


def cmd_version(_args: argparse.Namespace) -> int:
    """The installed version (pyproject.toml's, through the package metadata)."""
    print(f"gpu-rebalancer {rebalancer.__version__}")
    return EXIT_OK


def cmd_snapshot(args: argparse.Namespace) -> int:
    """`rebalancer snapshot`: a snapshot directory (DESIGN §4) from a live cluster and Prometheus."""
    from rebalancer.snapshot_command import run_snapshot

    return run_snapshot(args, _policy(args.policy))


def cmd_aggregate(args: argparse.Namespace) -> int:
    """`rebalancer aggregate`: telemetry-windows.json from a snapshot directory's raw history."""
    from rebalancer.snapshot_command import run_aggregate

    return run_aggregate(args, _policy(args.policy))


def cmd_simulate(args: argparse.Namespace) -> int:
    """Replay a GPU trace; wall time is measured here, at the edge, around the pure replay."""
    from rebalancer.simulate import render as render_simulation
    from rebalancer.simulate import run_simulation
    from rebalancer.simulate_command import options_from_args as simulate_options

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
    from rebalancer.kubeapi import load_api_client
    from rebalancer.reclaim import WorkloadWriter

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


def cmd_advise(args: argparse.Namespace) -> int:
    """`rebalancer advise`: workloads that would fit a cheaper GPU model, a MIG slice or fewer GPUs."""
    from rebalancer.advise_command import run as run_advise

    return run_advise(args)


def cmd_waste(args: argparse.Namespace) -> int:
    """`rebalancer waste`: idle GPU-hours and their cost per team over a period (rebalancer.waste)."""
    from rebalancer.waste_command import run as run_waste

    return run_waste(args)


class _VersionAction(argparse.Action):
    """`--version`, as argparse's own version action prints it, with the version looked up only when
    asked for (`rebalancer.__version__`)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **_: Any) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="show program's version number and exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        sys.stdout.write(f"gpu-rebalancer {rebalancer.__version__}\n")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rebalancer", description="A descheduler for GPU clusters.")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    once = sub.add_parser("once", help="run one cycle and print its report")
    once.add_argument("--snapshot", metavar="DIR", help="evaluate a snapshot directory (always dry-run)")
    once.add_argument("--policy", metavar="FILE", help="policy file (default: built-in safe policy)")
    once.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "markdown", "html"),
        default="text",
        help="report format (html: one self-contained page)",
    )
    once.add_argument(
        "--exit-code",
        action="store_true",
        help=f"exit {EXIT_WOULD_ACT} when the cycle evicted or changed a workload, or (dry run) would "
        "have: a CI job fails on a policy that would act",
    )
    add_live_once_arguments(once, memory=True)  # without --snapshot: one cycle against the live cluster
    once.set_defaults(func=cmd_once)

    run = sub.add_parser("run", help="the daemon: cycles every interval, leader election, /metrics")
    add_run_arguments(run)
    run.set_defaults(func=cmd_run)

    validate = sub.add_parser("validate", help="check policy files; exit 2 listing every problem")
    validate.add_argument("policies", nargs="+", metavar="POLICY")
    validate.set_defaults(func=cmd_validate)

    explain = sub.add_parser(
        "explain",
        help="every strategy's and guard's verdict on one node or pod, the ones that did not act too",
    )
    explain.add_argument("subject", metavar="NODE|NAMESPACE/POD", help="e.g. gpu-a-3 or ml/train-0")
    explain.add_argument("--snapshot", metavar="DIR", help="explain a snapshot directory (else: live)")
    explain.add_argument("--policy", metavar="FILE", help="policy file (default: built-in safe policy)")
    explain.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "yaml"),
        default="text",
        help="json / yaml: the same verdicts as one document (subject, per strategy its proposals with "
        "the planner's verdict, what it left alone and why, skipped; the findings naming it)",
    )
    add_live_once_arguments(explain)  # without --snapshot: the source a live `once` reads, always dry
    explain.set_defaults(func=cmd_explain)

    strategies = sub.add_parser("strategies", help="list the installed strategies and their arguments")
    strategies.add_argument(
        "-o",
        "--output",
        choices=("text", "yaml"),
        default="text",
        help="yaml: a policy fragment, every strategy with its default arguments and their descriptions",
    )
    strategies.set_defaults(func=cmd_strategies)

    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=cmd_version)

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

    aggregate = sub.add_parser(
        "aggregate",
        help="write a snapshot's telemetry-windows.json (the cycle's telemetry rows) from its raw history",
    )
    aggregate.add_argument("--snapshot", metavar="DIR", required=True, help="the snapshot directory")
    aggregate.add_argument(
        "--policy", metavar="FILE", help="the policy whose windows and telemetry mapping to use"
    )
    aggregate.set_defaults(func=cmd_aggregate)

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
    scope = restore.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="with --all-reclaimed: only this namespace")
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="with --all-reclaimed: every namespace (what happens without -n too)",
    )
    restore.add_argument("--dry-run", action="store_true", help="server-side dry run: check, change nothing")
    restore.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster, then ~/.kube)"
    )
    restore.add_argument("--context", help="kubeconfig context")
    restore.set_defaults(func=cmd_restore)

    simulate = sub.add_parser("simulate", help="replay a GPU cluster trace and report node-hours")
    add_simulate_arguments(simulate)
    simulate.set_defaults(func=cmd_simulate)

    waste = sub.add_parser("waste", help="idle GPU-hours and their cost per team over a period")
    add_waste_arguments(waste)
    waste.set_defaults(func=cmd_waste)

    advise = sub.add_parser(
        "advise",
        help="workloads that would fit a cheaper GPU model, a MIG slice or fewer GPUs, with the saving",
    )
    add_advise_arguments(advise)
    advise.set_defaults(func=cmd_advise)
    return parser


def _run_command(args: argparse.Namespace, *, whole_process: bool) -> int:
    """The command, with the cyclic collector paused unless it is the daemon.

    A one-shot command allocates a snapshot's millions of long-lived objects, evaluates and exits: a
    collection would visit them all and free next to nothing (reference counting frees the rest). Run
    as the process (`whole_process`: the console script, `python -m rebalancer`), the collector stays
    off until exit, and the heap is frozen before it, as the collection the interpreter makes on the way
    out would be wasted too; called in-process (tests), it is paused for the call only. `rebalancer run`
    collects normally: it lives for days.
    """
    func: Callable[[argparse.Namespace], int] = args.func
    if func is cmd_run:
        return func(args)
    if whole_process:
        gc.disable()
        try:
            return func(args)
        finally:
            # The interpreter still collects once on its way out, disabled or not: frozen objects are
            # left out of that visit (1.8 s of a 7 s `once --snapshot` at 5,000 nodes).
            gc.freeze()
    with collector_paused():
        return func(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = _run_command(args, whole_process=argv is None)
    except Problems as exc:
        for problem in exc.problems:  # a problem may quote a URL the operator gave, credentials and all
            print(f"rebalancer: error: {redact(problem)}", file=sys.stderr)
        return EXIT_BAD_INPUT if isinstance(exc, InputError) else EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
