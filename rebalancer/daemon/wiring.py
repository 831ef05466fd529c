"""The composition root: flags and policy -> source, evictor, memory, elector, sinks, server; and run.

Owns building the daemon's collaborators from `rebalancer run`'s and a live `rebalancer once`'s flags,
and nothing else:

- the snapshot source: a KubeSource with Prometheus telemetry when the running policy asks for it
  (`--prometheus-url` replaces `telemetry.prometheus.url`; `--allow-service-account-token` lets its
  bearer token be the pod's service-account token). `rebalancer run` builds it on a KubeCache (one
  watch per kind of nodes, pods and PDBs for the daemon's life, started by the first cycle, stopped at
  exit); a live `once` and `explain` list once;
- the live edge, the same for `rebalancer run` and a live `once`: the policy's `eviction:` section gets
  the ClusterActuator (drain marks, checkpoint requests, and the memory kept by the state store: the
  ConfigMap `--state-configmap` of the Lease's namespace (`once`: `--state-namespace`), or
  `--state-file`; none when forced dry with `--dry-run`) and the Events sink; a server-side dry run
  gets a plain KubeEvictor and an in-process memory;
- the Lease elector, the notifiers (one worker per Slack / webhook sink), the metrics (with the watch
  cache's age and relists), the HTTP servers
  (`/metrics` `/healthz` `/readyz` on `--listen`, `/report` `/report.html` on `--report-listen`, or on
  `--listen` too when both name the same address, or nowhere with `off`);
- running: `run_command` serves until SIGTERM / SIGINT, then exits 0 after the decision in flight;
  `run_live_once` runs one cycle.

It must not contain rebalancing logic nor run cycles itself: `daemon.loop` does.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import FrameType

import structlog
from kubernetes import client

from rebalancer.actuator import ClusterActuator, DrainMarkKeeper
from rebalancer.cycle_report import CycleReport
from rebalancer.daemon.http import ALL_PATHS, REPORT_PATHS, STATUS_PATHS, ServerLimits, Status, StatusServer
from rebalancer.daemon.lease import LeaseElector
from rebalancer.daemon.loop import (
    Daemon,
    DaemonError,
    DaemonSinks,
    Deadlines,
    Leadership,
    LiveEdge,
    SnapshotSource,
)
from rebalancer.daemon.reload import PolicyWatcher
from rebalancer.errors import InputError
from rebalancer.fence import WriteFence
from rebalancer.kube_evictor import REQUESTER, KubeEvictor
from rebalancer.kubeapi import load_api_client
from rebalancer.model import Snapshot
from rebalancer.policy import (
    LoadedPolicy,
    NotifyConfig,
    PrometheusConfig,
    SlackSinkConfig,
    WebhookSinkConfig,
    default_policy,
    format_duration,
    prometheus_with_url,
)
from rebalancer.sinks.events import KubeEventsSink
from rebalancer.sinks.log import configure_logging
from rebalancer.sinks.metrics import DaemonMetrics
from rebalancer.sinks.notify import HttpPoster, Notifier, configured_sinks
from rebalancer.sinks.slack import SlackSink
from rebalancer.sinks.webhook import WebhookSink
from rebalancer.sources.kube import ClusterReader, KubeSource
from rebalancer.sources.kube_cache import KubeCache
from rebalancer.sources.prometheus import PrometheusTelemetrySource
from rebalancer.sources.prometheus_labels import LabelSets
from rebalancer.sources.usage_history import PrometheusUsage
from rebalancer.state import ConfigMapStateStore, FileStateStore, StateStore

__all__ = [
    "build_notifiers",
    "build_state_store",
    "kube_snapshot_source",
    "lease_fence",
    "live_edge",
    "live_snapshot",
    "live_source_description",
    "run_command",
    "run_live_once",
    "start_status_servers",
]

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

log = structlog.get_logger("rebalancer.daemon")


# --------------------------------------------------------------------------- the source


def _prometheus(loaded: LoadedPolicy, url: str | None) -> PrometheusConfig | None:
    """The policy's Prometheus connection, with its URL replaced by `url` when given (InputError when
    the connection refuses it: a reloaded policy's credentials over a plain http:// flag fail the cycle
    with that message, never with the URL's credentials)."""
    cfg = loaded.policy.telemetry
    return prometheus_with_url(cfg.prometheus if cfg is not None else None, url)


def kube_snapshot_source(
    api_client: client.ApiClient,
    *,
    prometheus_url: str | None = None,
    namespaces: Sequence[str] | None = None,
    allow_service_account_token: bool = False,
    described: str = "live cluster",
    cluster: ClusterReader | None = None,
) -> SnapshotSource:
    """Snapshots of the live cluster, with Prometheus telemetry when the running policy asks for it.

    `prometheus_url` (the CLI's --prometheus-url) replaces `telemetry.prometheus.url`, keeping the rest
    of the policy's connection settings; `allow_service_account_token` (--allow-service-account-token)
    is handed to the Prometheus source. Telemetry needs `telemetry` in the policy and a strategy with a
    telemetry window. `described` is what the reports say the snapshots' source is (no credential).
    A strategy reading long-window usage (gpu-rightsizing) gets it from the same Prometheus, read once an
    hour (`sources.usage_history.PrometheusUsage`, kept across this source's cycles), and the label
    sets of the telemetry answers are decoded and identified once for all its snapshots
    (`sources.prometheus_labels.LabelSets`; one snapshot at a time, as the daemon's cycles run).
    `cluster` is where the nodes, pods and PDBs come from: a `KubeCache.read`, or (None) lists made for
    each snapshot.
    """

    usage: dict[str, PrometheusUsage] = {}  # by Prometheus URL, kept across the daemon's cycles
    label_sets = LabelSets()  # the telemetry answers' label sets, kept across the daemon's cycles

    def source(now: datetime, loaded: LoadedPolicy) -> Snapshot:
        telemetry = None
        cfg = loaded.policy.telemetry
        windows = loaded.telemetry_windows()
        conn = _prometheus(loaded, prometheus_url)
        if cfg is not None and windows and conn is not None:
            telemetry = PrometheusTelemetrySource(
                cfg,
                windows,
                prometheus=conn,
                allow_service_account_token=allow_service_account_token,
                label_sets=label_sets,
            )
        kube = KubeSource(
            api_client,
            loaded,
            namespaces=namespaces,
            telemetry=telemetry,
            described=described,
            cluster=cluster,
        )
        snapshot = kube.snapshot(now)
        if conn is None or loaded.usage_period() is None:
            return snapshot
        reader = usage.get(conn.url)
        if reader is None or reader.prometheus != conn:
            reader = usage[conn.url] = PrometheusUsage(
                conn, allow_service_account_token=allow_service_account_token
            )
        return reader.attach(snapshot, loaded)

    return source


# --------------------------------------------------------------------------- the live edge


def build_state_store(
    args: argparse.Namespace, api_client: client.ApiClient, leadership: Leadership | None = None
) -> StateStore | None:
    """Where `rebalancer run` (and a live `once`) keeps its memory: None when the run is forced dry
    (`--dry-run` saves no memory), else the file `--state-file` or the ConfigMap `--state-configmap` in
    the Lease's namespace (`--lease-namespace`; `once`: `--state-namespace`; default the pod's), its
    writes fenced by the lease (not by the cycle's deadline: the memory of what was done is always saved
    while this replica leads) and stamped with the leader's term. Builds the store only: no request is
    made."""
    if args.dry_run is True:
        return None
    if args.state_file is not None:
        return FileStateStore(args.state_file)
    namespace = getattr(args, "lease_namespace", None) or getattr(args, "state_namespace", None)
    namespace = namespace or _default_namespace()
    if leadership is None:
        return ConfigMapStateStore(api_client, namespace=namespace, name=args.state_configmap)
    elector = leadership.elector
    return ConfigMapStateStore(
        api_client,
        namespace=namespace,
        name=args.state_configmap,
        fence=lease_fence(leadership),
        term=lambda: elector.term,
    )


def lease_fence(leadership: Leadership | None) -> WriteFence:
    """A write fence open while `leadership`'s lease has more than its margin left (always, without)."""
    if leadership is None:
        return WriteFence()
    elector, margin = leadership.elector, leadership.margin
    return WriteFence(lambda: elector.lease_left(margin))


def live_edge(
    api_client: client.ApiClient,
    loaded: LoadedPolicy,
    identity: str,
    *,
    state_store: StateStore | None = None,
    fence: WriteFence | None = None,
    tend_marks_when_dry: bool = True,
) -> tuple[LiveEdge, tuple[KubeEventsSink, ...]]:
    """What `rebalancer run` puts around live evictions, and the sinks that go with it.

    The actuator is built once from the policy's `eviction:` section (a change there needs a restart:
    the actuator's memory must not be lost), so a reload that changes it runs with the whole running
    section kept (the planner reads it too: its timeouts must be the actuator's), says so, and counts a
    reload error; `dry_run: true` still applies at once. Dry-run cycles go through the actuator's
    `DrainMarkKeeper` (marks left by live cycles still expire), unless `tend_marks_when_dry` is False (a
    dry `once` writes nothing). With `eviction.server_dry_run` the API server checks every eviction and
    persists nothing, so there is no actuator: nothing of its own is written either.
    """
    cfg = loaded.policy.eviction
    requested_by = f"{REQUESTER}/{identity}"

    def policy_changed(old: LoadedPolicy, new: LoadedPolicy) -> LoadedPolicy:
        if old.policy.eviction == new.policy.eviction:
            return new
        log.error(
            "policy `eviction:` changed: restart the daemon to apply it; the rest of the change runs, "
            "with the running `eviction:` section",
            source=new.source,
        )
        kept = new.policy.model_copy(update={"eviction": old.policy.eviction})
        return new.model_copy(update={"policy": kept})

    if cfg.server_dry_run:
        evictor = KubeEvictor(
            api_client,
            grace_period_seconds=cfg.grace_period_seconds,
            server_dry_run=True,
            retries=cfg.retries,
            requested_by=requested_by,
        )
        return LiveEdge(evictor, on_policy_change=policy_changed), ()
    fence = fence or WriteFence()
    actuator = ClusterActuator.from_config(
        api_client, cfg, state_store=state_store, requested_by=requested_by, fence=fence
    )
    actuator.new_term()  # the first cycle takes the stored memory and cleans orphan marks
    edge = LiveEdge(
        actuator,
        memory=actuator.memory,
        on_policy_change=policy_changed,
        on_lost_leadership=actuator.new_term,
        dry_run_evictor=DrainMarkKeeper(actuator) if tend_marks_when_dry else None,
        fence=fence,
    )
    return edge, (KubeEventsSink(api_client),)


# --------------------------------------------------------------------------- notifiers


def build_notifiers(
    notify: NotifyConfig,
    *,
    on_result: Callable[[str, str], None] | None = None,
    environ: Mapping[str, str] | None = None,
    poster_factory: Callable[[], HttpPoster] = HttpPoster,
    clock: Callable[[], float] = time.monotonic,
) -> list[Notifier]:
    """One Notifier (worker thread, bounded queue) per configured Slack / webhook sink, in the order and
    with the names of `configured_sinks`."""
    notifiers: list[Notifier] = []
    for name, config in configured_sinks(notify):
        if isinstance(config, SlackSinkConfig):
            sink = SlackSink(config, name=name, poster=poster_factory(), environ=environ)
            notifiers.append(Notifier(sink, clock=clock, on_result=on_result))
        elif isinstance(config, WebhookSinkConfig):
            webhook = WebhookSink(config, name=name, poster=poster_factory(), environ=environ)
            if not webhook.signed:
                log.warning("webhook has no signing secret: deliveries are unsigned", sink=webhook.name)
            notifiers.append(Notifier(webhook, clock=clock, on_result=on_result))
    return notifiers


def default_notifiers(notify: NotifyConfig, on_result: Callable[[str, str], None]) -> Sequence[Notifier]:
    return build_notifiers(notify, on_result=on_result)


# --------------------------------------------------------------------------- HTTP


# `/report` is read by a person now and then: one request thread, a few connections.
REPORT_LIMITS = ServerLimits(threads=1, connection_limit=16)


def start_status_servers(
    daemon: Status,
    listen: tuple[str, int],
    report_listen: tuple[str, int] | None,
    *,
    limits: ServerLimits | None = None,
    report_limits: ServerLimits = REPORT_LIMITS,
) -> list[StatusServer]:
    """The daemon's endpoints, serving: `/metrics` `/healthz` `/readyz` on `listen`, `/report` and
    `/report.html` on `report_listen` (the same server when it is `listen`, none when None).

    Raises DaemonError naming the flag when an address cannot be listened on.
    """
    servers: list[StatusServer] = []
    together = report_listen == listen
    wanted: list[tuple[str, tuple[str, int], tuple[str, ...], ServerLimits | None]] = [
        ("--listen", listen, ALL_PATHS if together else STATUS_PATHS, limits)
    ]
    if report_listen is not None and not together:
        wanted.append(("--report-listen", report_listen, REPORT_PATHS, report_limits))
    for flag, (host, port), paths, bounds in wanted:
        try:
            servers.append(StatusServer(daemon, host, port, paths=paths, limits=bounds).start())
        except OSError as exc:
            for server in servers:
                server.stop()
            raise DaemonError([f"{flag}: cannot listen on {host}:{port}: {exc.strerror or exc}"]) from None
    return servers


# --------------------------------------------------------------------------- flags


def _default_namespace() -> str:
    env = os.environ.get("POD_NAMESPACE")
    if env:
        return env
    with contextlib.suppress(OSError):
        text = SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip()
        if text:
            return text
    return "default"


def _default_identity() -> str:
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


def _prometheus_url(args: argparse.Namespace, loaded: LoadedPolicy) -> str | None:
    """`--prometheus-url`, refused at start (InputError, exit 2) when the policy's connection would
    refuse it: not http(s), or plain http:// while the policy sends credentials."""
    url: str | None = args.prometheus_url
    _prometheus(loaded, url)
    return url


def live_source_description(args: argparse.Namespace) -> str:
    """`live cluster (context prod)`: what a live report says it read, from the flags alone (a context
    name, never a server address or a credential)."""
    context = getattr(args, "context", None)
    if context:
        return f"live cluster (context {context})"
    if getattr(args, "kubeconfig", None):
        return "live cluster (the kubeconfig's current context)"
    return "live cluster (in-cluster, else the kubeconfig's current context)"


def _api_client(args: argparse.Namespace) -> client.ApiClient:
    """The cluster's client; a kubeconfig to fix raises kubeapi.KubeConfigError (bad input)."""
    return load_api_client(args.kubeconfig, args.context)


# --------------------------------------------------------------------------- running


def live_snapshot(args: argparse.Namespace, loaded: LoadedPolicy, now: datetime) -> Snapshot:
    """One snapshot of the live cluster through the source a live `once` reads (for `explain`: the
    caller plans on it, dry; nothing is published or evicted here)."""
    configure_logging(args.log_format, level=logging.WARNING)
    source = kube_snapshot_source(
        _api_client(args),
        prometheus_url=_prometheus_url(args, loaded),
        namespaces=args.namespaces,
        allow_service_account_token=args.allow_service_account_token,
        described=live_source_description(args),
    )
    return source(now, loaded)


def run_live_once(args: argparse.Namespace, loaded: LoadedPolicy) -> CycleReport:
    """One live cycle (snapshot of the cluster, evictions unless dry-run), notifications flushed.

    Raises DaemonError (or the source's error) when the cluster cannot be read.
    """
    prometheus_url = _prometheus_url(args, loaded)
    # The report goes to stdout; stderr gets only warnings and errors (no decision lines twice).
    configure_logging(args.log_format, level=logging.WARNING)
    api_client = _api_client(args)
    source = kube_snapshot_source(
        api_client,
        prometheus_url=prometheus_url,
        namespaces=args.namespaces,
        allow_service_account_token=args.allow_service_account_token,
        described=live_source_description(args),
    )
    # The edge of `run`: the policy's `eviction:` section, drain marks, and the daemon's memory, so that
    # one run after another (a CronJob) keeps cooldowns, the disruption budget and the circuit breaker.
    # A dry run of `once` writes nothing, not even the lifting of expired marks (the daemon's dry runs do).
    live, extra_sinks = live_edge(
        api_client,
        loaded,
        _default_identity(),
        state_store=build_state_store(args, api_client),
        tend_marks_when_dry=False,
    )
    daemon = Daemon(
        loaded,
        source,
        live=live,
        dry_run=args.dry_run,
        sinks=DaemonSinks(notifiers=default_notifiers, extra=extra_sinks),
    )
    try:
        report = daemon.run_cycle(raise_errors=True)
    finally:
        daemon.shutdown(notify_timeout=30.0)
    if report is None:  # pragma: no cover - a fresh daemon neither overlaps nor stops
        raise DaemonError(["the cycle did not run"])
    return report


def run_command(args: argparse.Namespace) -> int:
    """`rebalancer run`: serve until SIGTERM / SIGINT, then exit 0 after the decision in flight."""
    policy: PolicyWatcher | LoadedPolicy = PolicyWatcher(args.policy) if args.policy else default_policy()
    loaded = policy.current if isinstance(policy, PolicyWatcher) else policy
    prometheus_url = _prometheus_url(args, loaded)
    configure_logging(args.log_format)
    api_client = _api_client(args)
    identity = args.identity or _default_identity()
    metrics = DaemonMetrics()

    leadership: Leadership | None = None
    holder: list[Daemon] = []
    if args.leader_election:
        if args.leader_margin >= args.renew_deadline:
            raise InputError(["--leader-margin must be shorter than --renew-deadline"])

        def on_leadership(leading: bool) -> None:
            metrics.leader.set(1 if leading else 0)
            if not leading and holder:
                holder[0].lost_leadership()

        try:
            elector = LeaseElector(
                api_client,
                name=args.lease_name,
                namespace=args.lease_namespace or _default_namespace(),
                identity=identity,
                lease_duration=args.lease_duration,
                renew_deadline=args.renew_deadline,
                retry_period=args.retry_period,
                on_change=on_leadership,
            )
        except ValueError as exc:
            raise InputError([str(exc)]) from None
        leadership = Leadership(elector, args.leader_margin)
    cache = KubeCache(api_client, namespaces=args.namespaces)
    metrics.watch_cache(cache.status, stale_after=cache.stale_after)
    live, extra_sinks = live_edge(
        api_client,
        loaded,
        identity,
        state_store=build_state_store(args, api_client, leadership),
        fence=lease_fence(leadership),
    )
    daemon = Daemon(
        policy,
        kube_snapshot_source(
            api_client,
            prometheus_url=prometheus_url,
            namespaces=args.namespaces,
            allow_service_account_token=args.allow_service_account_token,
            described=live_source_description(args),
            cluster=cache.read,
        ),
        live=live,
        dry_run=args.dry_run,
        leadership=leadership,
        sinks=DaemonSinks(metrics=metrics, notifiers=default_notifiers, extra=extra_sinks),
        deadlines=Deadlines(shutdown=args.shutdown_timeout),
    )
    holder.append(daemon)
    servers = start_status_servers(daemon, args.listen, args.report_listen)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("stop requested", signal=signal.Signals(signum).name)
        daemon.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "daemon started",
        listen=servers[0].address,
        report=servers[-1].address if args.report_listen is not None else "off",
        policy=daemon.policy.source,
        interval=format_duration(daemon.policy.policy.interval),
        dry_run=daemon.dry_run(),
        leader_election=leadership is not None,
        identity=identity,
    )
    if leadership is not None:
        leadership.elector.start().wait_first_round(args.renew_deadline)
    daemon.start()
    while not daemon.stopping.wait(0.5):
        pass
    daemon.shutdown()
    cache.stop()
    for server in servers:
        server.stop()
    log.info("daemon stopped")
    return 0
