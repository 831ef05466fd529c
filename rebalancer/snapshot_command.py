"""`rebalancer snapshot` and `rebalancer aggregate`: the snapshot directory format of DESIGN §4, written
from a live cluster and Prometheus, and its window aggregates (`telemetry-windows.json`) from the raw
history a directory holds.

Owns what those two commands capture and write, and nothing of reading a snapshot (`sources.files`),
aggregating (`telemetry.windows`) or the command line's parsing and exit contract (`rebalancer.cli`,
which hands each command its policy). The Kubernetes and Prometheus clients are imported inside the
command that uses them, so that `aggregate` loads neither.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rebalancer import rfc3339
from rebalancer.cli import EXIT_FAILED, EXIT_OK
from rebalancer.errors import InputError
from rebalancer.redaction import redact

if TYPE_CHECKING:
    from rebalancer.policy import LoadedPolicy

# The controllers behind the GPU pods (any kind of `workloads.KINDS`), so that a replay resolves the
# same workloads.
WORKLOADS_FILE = "workloads.json"
_CLUSTER_LISTS = (
    ("nodes.json", "NodeList", "v1", "list_nodes"),
    ("pods.json", "PodList", "v1", "list_pods"),
    ("pdbs.json", "PodDisruptionBudgetList", "policy/v1", "list_pdbs"),
)


def _snapshot_now(text: str | None) -> datetime:
    from rebalancer.daemon.clock import utcnow

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
    from rebalancer.kubeapi import KubeConfigError, load_api_client
    from rebalancer.sources.kube import KubeSource, KubeSourceError

    explicit = args.kubeconfig is not None or args.context is not None
    try:
        source = KubeSource(load_api_client(args.kubeconfig, args.context), loaded)
        lists: list[tuple[str, dict[str, Any]]] = [
            (name, {"apiVersion": version, "kind": kind, "items": list(getattr(source, read)())})
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


def run_snapshot(args: argparse.Namespace, loaded: LoadedPolicy) -> int:
    """`rebalancer snapshot` with the policy it names."""

    from rebalancer.policy import parse_duration, prometheus_with_url
    from rebalancer.redaction import redact_url
    from rebalancer.sources.files import SNAPSHOT_FILE
    from rebalancer.sources.prometheus import PrometheusError, PrometheusTelemetrySource
    from rebalancer.telemetry.exposition import render_openmetrics
    from rebalancer.telemetry.windows import LOOKBACK_SECONDS

    cfg = loaded.policy.telemetry
    if cfg is None:
        raise InputError(["snapshot: telemetry is disabled in the policy (telemetry: null)"])
    try:
        window = parse_duration(args.window)
    except ValueError as exc:
        raise InputError([f"snapshot: --window: {exc}"]) from None
    conn = prometheus_with_url(cfg.prometheus, args.prometheus_url, "snapshot")
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
    if loaded.telemetry_windows():
        from rebalancer.sources.files import SnapshotError

        try:
            _write_aggregates(out, loaded, "snapshot")
        except SnapshotError as exc:  # no usable DCGM series: the raw history is the whole snapshot
            for problem in exc.problems:
                print(f"rebalancer: warning: telemetry aggregates not written: {problem}", file=sys.stderr)
    return EXIT_OK


def _write_aggregates(root: Path, loaded: LoadedPolicy, command: str) -> None:
    """telemetry-windows.json in `root`: the rows of the policy's windows, from the raw history there."""
    from rebalancer.sources.files import aggregate_snapshot_dir
    from rebalancer.sources.telemetry_aggregates import AGGREGATES_FILE, write_aggregates

    aggregates = aggregate_snapshot_dir(root, loaded)
    target = root / AGGREGATES_FILE
    try:
        write_aggregates(target, aggregates)
    except OSError as exc:
        raise InputError([f"{command}: cannot write {target}: {exc.strerror or exc}"]) from None
    rows = sum(len(window.gpus) for window in aggregates.windows.values())
    seconds = ", ".join(f"{s}s" for s in sorted(aggregates.windows))
    stamp = rfc3339.format_utc(aggregates.now, "milliseconds")
    print(f"wrote {target}: {rows} rows for windows {seconds} at {stamp}")


def run_aggregate(args: argparse.Namespace, loaded: LoadedPolicy) -> int:
    """`rebalancer aggregate` with the policy it names."""
    if loaded.policy.telemetry is None:
        raise InputError(["aggregate: telemetry is disabled in the policy (telemetry: null)"])
    if not loaded.telemetry_windows():
        raise InputError(
            ["aggregate: no strategy of the policy reads telemetry windows: nothing to aggregate"]
        )
    _write_aggregates(Path(args.snapshot), loaded, "aggregate")
    return EXIT_OK
