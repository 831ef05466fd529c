"""The policy file: pydantic models with `extra="forbid"`, validated in full at load.

Owns the schema operators write (strategies in order with their args, guards, limits, gang keys,
GPU-share resources, GPU prices, eviction settings; the `telemetry:` section in `policy.telemetry`,
`notify:` in `policy.sinks`, the field types they share in `policy.fields`, all re-exported here) and
`load_policy()`, which turns YAML into a `Policy` or a `PolicyError` listing every problem with file,
line and field path.
It must not touch the cluster, Prometheus or the clock; secrets never live here (only the names of
the env vars or files that hold them).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from rebalancer import yaml_input
from rebalancer.errors import InputError
from rebalancer.memo import ObjectMemo
from rebalancer.policy.fields import (
    MAX_DURATION_SECONDS,
    Count,
    Duration,
    Percent,
    StrictModel,
    format_duration,
    parse_duration,
    plain_http_to_remote_host,
)
from rebalancer.policy.sinks import (
    DigestPeriod,
    NotifyConfig,
    SinkFilters,
    SlackSinkConfig,
    WebhookSinkConfig,
)
from rebalancer.policy.telemetry import (
    LabelMapping,
    MetricConfig,
    PrometheusConfig,
    TelemetryConfig,
    TelemetryPreset,
    prometheus_with_url,
)
from rebalancer.redaction import redact
from rebalancer.registry import StrategyArgs, all_strategies, get_strategy
from rebalancer.wording import clip, quoted

__all__ = [
    "BUILTIN_DEFAULT_ORDER",
    "EXAMPLE_GPU_PRICES",
    "MAX_DURATION_SECONDS",
    "MAX_GPU_PRICE_PER_HOUR",
    "MAX_POLICY_CHARS",
    "ConfiguredStrategy",
    "Count",
    "DigestPeriod",
    "Duration",
    "EvictionConfig",
    "GangConfig",
    "GpuPrice",
    "GpuSharingConfig",
    "GuardsConfig",
    "LabelMapping",
    "LabelSelectorConfig",
    "LabelSelectorRequirementConfig",
    "LimitsConfig",
    "LoadedPolicy",
    "MetricConfig",
    "NamespaceFilter",
    "NotifyConfig",
    "Percent",
    "Policy",
    "PolicyError",
    "PricesConfig",
    "PrometheusConfig",
    "SharedGpuResource",
    "SinkFilters",
    "SlackSinkConfig",
    "StrategyConfig",
    "StrictModel",
    "TelemetryConfig",
    "TelemetryPreset",
    "WebhookSinkConfig",
    "default_policy",
    "duplicate_keys",
    "format_duration",
    "format_loc",
    "load_policy",
    "loads_policy",
    "parse_duration",
    "parse_policy",
    "plain_http_to_remote_host",
    "prometheus_with_url",
]

# --------------------------------------------------------------------------- sections


class LabelSelectorRequirementConfig(StrictModel):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _values_match_operator(self) -> LabelSelectorRequirementConfig:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


class LabelSelectorConfig(StrictModel):
    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: tuple[LabelSelectorRequirementConfig, ...] = ()


class NamespaceFilter(StrictModel):
    include: tuple[str, ...] = ()
    # The control plane, node leases, the GPU operator (driver, device plugin, DCGM exporter) and the
    # monitoring stack that holds the telemetry.
    exclude: tuple[str, ...] = ("kube-system", "kube-node-lease", "gpu-operator", "monitoring")

    @model_validator(mode="after")
    def _not_both(self) -> NamespaceFilter:
        overlap = set(self.include) & set(self.exclude)
        if overlap:
            raise ValueError(f"namespaces both included and excluded: {', '.join(sorted(overlap))}")
        return self


class GuardsConfig(StrictModel):
    """Per-pod safety checks (DESIGN §6). Defaults are the safe choice."""

    namespaces: NamespaceFilter = NamespaceFilter()
    label_selector: LabelSelectorConfig | None = None
    min_pod_age: Duration = 600
    # Pods at or above this priority (system-cluster-critical is 2000000000) are never evicted.
    priority_threshold: int = 2_000_000_000
    evict_local_storage: bool = False
    allow_shm_empty_dir: bool = True
    evict_bare_pods: bool = False
    cooldown: Duration = 1800
    # At most this many disruptions of one workload (cycles that evicted pods of its controller) within
    # `disruption_window`; null: no limit beyond the cooldown. The default bounds churn: no workload is
    # moved more than 3 times a week, whatever the strategies find.
    max_disruptions_per_workload: Count | None = Field(default=3, ge=1)
    disruption_window: Annotated[Duration, Field(gt=0)] = 7 * 86400


class LimitsConfig(StrictModel):
    """Budgets spent across one cycle; null means unlimited."""

    # >= GPUs per node, so that a node of 1-GPU pods can still be drained whole.
    max_per_node: Count | None = Field(default=16, ge=1)
    max_per_namespace: Count | None = Field(default=5, ge=1)
    max_per_cycle: Count | None = Field(default=10, ge=1)


class GangConfig(StrictModel):
    """Label or annotation keys whose value names the gang (group) a pod belongs to; first match wins."""

    keys: tuple[str, ...] = (
        "scheduling.x-k8s.io/pod-group",
        "scheduling.k8s.io/group-name",
        "volcano.sh/job-name",
        "jobset.sigs.k8s.io/jobset-name",
        "training.kubeflow.org/job-name",
    )


class SharedGpuResource(StrictModel):
    """An extended resource that hands out shares of one physical GPU.

    `milli_per_unit`: how many thousandths of a device one unit is (time-slicing with 4 replicas: 250;
    a milli-GPU resource: 1).
    """

    milli_per_unit: int = Field(ge=1, le=1000)


class GpuSharingConfig(StrictModel):
    resources: dict[str, SharedGpuResource] = Field(
        default_factory=lambda: {
            "nvidia.com/gpu.shared": SharedGpuResource(milli_per_unit=250),
            "gpu-rebalancer.io/gpu-milli": SharedGpuResource(milli_per_unit=1),
        }
    )


# Round on-demand cloud list prices in USD: examples to replace with what the GPUs really cost. Not a
# citation of any provider's price list. The right-sizing catalogue (`rebalancer.gpu_catalogue`) has
# no prices of its own: a model without one here (the T4 by default) is never offered as a target.
EXAMPLE_GPU_PRICES = {
    "NVIDIA-H100-80GB-HBM3": 6.90,
    "NVIDIA-A100-SXM4-80GB": 5.10,
    "NVIDIA-A100-SXM4-40GB": 4.10,
    "NVIDIA-L40S": 2.30,
    "NVIDIA-A30": 1.60,
    "NVIDIA-L4": 1.15,
    "NVIDIA-A10": 1.00,
}


# No GPU rents for more than this an hour; a larger price is a typo, and its savings would overflow.
MAX_GPU_PRICE_PER_HOUR = 10_000
GpuPrice = Annotated[float, Field(ge=0, le=MAX_GPU_PRICE_PER_HOUR, allow_inf_nan=False)]


class PricesConfig(StrictModel):
    """Hourly price of one GPU, per `nvidia.com/gpu.product` value; used for estimated savings."""

    per_gpu_hour: dict[str, GpuPrice] = Field(default_factory=lambda: dict(EXAMPLE_GPU_PRICES))
    default_per_gpu_hour: GpuPrice | None = None


# A taint key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
_TAINT_KEY = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


class EvictionConfig(StrictModel):
    """How live evictions are carried out (rebalancer.actuator); a dry run ignores all of it.

    `drain_timeout`: a node marked draining that is still there with pods after this long gets its mark
    removed (twice this long even when empty). `checkpoint_timeout`: how long a pod that opted in to
    checkpoint-before-evict is given to answer before it is evicted anyway. `reschedule_timeout`: pods of a
    workload the rebalancer evicted that are still unscheduled this long after open the circuit breaker.
    """

    grace_period_seconds: int | None = Field(default=None, ge=0)
    # The API server runs every check (PDBs included) and persists nothing: a live cluster, no change.
    server_dry_run: bool = False
    retries: int = Field(default=3, ge=0, le=10)
    drain_taint_key: str = "rebalancer.gpu/draining"
    drain_taint_effect: Literal["NoSchedule", "PreferNoSchedule"] = "NoSchedule"
    drain_timeout: Duration = Field(default=1800, gt=0)
    checkpoint_timeout: Duration = Field(default=600, ge=0)
    reschedule_timeout: Duration = Field(default=900, gt=0)

    @field_validator("drain_taint_key")
    @classmethod
    def _taint_key(cls, key: str) -> str:
        prefix = key.rpartition("/")[0]
        if not _TAINT_KEY.match(key) or len(prefix) > 253:
            raise ValueError("not a valid taint key: an optional DNS prefix and `/`, then a name")
        return key


class StrategyConfig(StrictModel):
    name: str
    enabled: bool = True
    args: dict[str, Any] = Field(default_factory=dict)


# The shipped strategies, in the order a policy that does not list any runs them.
# A policy is a page or two of YAML; one of megabytes is a mistake (and slow to validate).
MAX_POLICY_CHARS = 1_000_000

BUILTIN_DEFAULT_ORDER = ("gpu-affinity", "idle-gpu", "topology-spread", "gpu-consolidation")


def _default_strategies() -> tuple[StrategyConfig, ...]:
    return tuple(
        StrategyConfig(name=name) for name in BUILTIN_DEFAULT_ORDER if get_strategy(name) is not None
    )


class Policy(StrictModel):
    """Every default is the value policies/default.yaml writes out (a test keeps the two equal)."""

    dry_run: bool = True
    interval: Duration = 300
    strategies: tuple[StrategyConfig, ...] = Field(default_factory=_default_strategies)
    guards: GuardsConfig = GuardsConfig()
    limits: LimitsConfig = LimitsConfig()
    gangs: GangConfig = GangConfig()
    gpu_sharing: GpuSharingConfig = GpuSharingConfig()
    telemetry: TelemetryConfig | None = TelemetryConfig()
    prices: PricesConfig = PricesConfig()
    notify: NotifyConfig = NotifyConfig()
    eviction: EvictionConfig = EvictionConfig()

    @field_validator("interval")
    @classmethod
    def _sane_interval(cls, interval: int) -> int:
        if interval < 10:
            raise ValueError("interval must be at least 10s")
        return interval

    @model_validator(mode="after")
    def _telemetry_read_fits_the_cycle(self) -> Policy:
        """A cycle's telemetry read must end well inside its interval, leaving time to plan and evict."""
        prometheus = self.telemetry.prometheus if self.telemetry is not None else None
        if prometheus is not None and prometheus.deadline > self.interval // 2:
            raise ValueError(
                f"telemetry.prometheus.deadline ({format_duration(prometheus.deadline)}) must be at most "
                f"half the interval ({format_duration(self.interval)}): a cycle also plans and evicts"
            )
        return self


# --------------------------------------------------------------------------- loading


class PolicyError(InputError):
    """A policy that cannot be used; `problems` holds one line per problem, each naming where."""


@functools.lru_cache(maxsize=64)
def _file_name(source: str) -> str:
    """What `LoadedPolicy.name` says of a source (every cycle's report carries it)."""
    return Path(source).name if not source.startswith("<") else source


def _digest(policy: Policy) -> str:
    normal = json.dumps(policy.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(normal.encode("utf-8")).hexdigest()


_DIGESTS: ObjectMemo[Policy, str] = ObjectMemo(_digest)


class ConfiguredStrategy(BaseModel):
    """A strategy of the policy, resolved against the registry with its arguments validated."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str
    args: StrategyArgs


class LoadedPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    policy: Policy
    strategies: tuple[ConfiguredStrategy, ...]
    source: str = "<default>"

    @property
    def name(self) -> str:
        """The policy's file name (`default.yaml`), or what stands for it (`<built-in default policy>`)."""
        return _file_name(self.source)

    @property
    def digest(self) -> str:
        """`sha256:<hex>` of the normalised policy: every value as validated, keys sorted, as JSON, so
        comments, key order, spelling of durations and defaults written out or left implicit do not
        change it; any value that changes what runs does. Worked out once per (frozen) Policy object:
        every cycle's report carries it."""
        return _DIGESTS(self.policy)

    def telemetry_windows(self) -> frozenset[int]:
        windows: set[int] = set()
        for configured in self.strategies:
            windows |= configured.args.telemetry_windows()
        return frozenset(windows)

    def usage_period(self) -> tuple[int, int] | None:
        """The longest usage history (window, step) a strategy of the policy reads, None when none does."""
        periods = [p for configured in self.strategies if (p := configured.args.usage_period()) is not None]
        return max(periods, default=None)


def format_loc(loc: Sequence[int | str]) -> str:
    """`('strategies', 1, 'args', 'window')` -> `strategies[1].args.window` (each key cut to a readable
    length: a key is input too)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            key = clip(str(part), 60)
            out += f".{key}" if out else key
    return out or "(top level)"


def _line_of(root: yaml.Node | None, loc: Sequence[int | str]) -> int | None:
    """1-based line of the deepest YAML node that `loc` reaches."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            child = next((v for k, v in reversed(node.value) if getattr(k, "value", None) == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
        else:
            child = None
        if child is None:
            break
        node = child
        line = node.start_mark.line + 1
    return line


def _yaml_kind(value: object) -> str:
    """What a YAML author wrote, in YAML words (`a list`, not `list` or a Python class name)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _describe(error: Mapping[str, Any]) -> str:
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    if kind in ("model_type", "dict_type"):
        return f"expected a mapping, got {_yaml_kind(error.get('input'))}"
    message = str(error.get("msg", "invalid value"))
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if "input" in error:
        given = error["input"]
        # Not twice: some validators (durations) quote the value in their own message already.
        echoed = f"got {quoted(given)}" in message or (isinstance(given, str) and quoted(given) in message)
        if (isinstance(given, str | int | float | bool) or given is None) and not echoed:
            message += f" (got {quoted(given)})"
    # Clipped: a long value given is quoted clipped, but the message of a validator may hold more. Long
    # enough for a list of what is known (finding kinds).
    return clip(redact(message), 600)  # a malformed URL given may carry its credentials


def _problems(
    exc: ValidationError, source: str, root: yaml.Node | None, prefix: Sequence[int | str] = ()
) -> Iterator[str]:
    for error in exc.errors():
        loc = (*prefix, *error["loc"])
        line = _line_of(root, loc)
        where = f"{source}:{line}" if line is not None else source
        yield f"{where}: {format_loc(loc)}: {_describe(error)}"


def _where(source: str, root: yaml.Node | None, loc: Sequence[int | str]) -> str:
    line = _line_of(root, loc)
    return f"{source}:{line}" if line is not None else source


def duplicate_keys(node: yaml.Node | None, source: str, loc: tuple[int | str, ...] = ()) -> Iterator[str]:
    """Keys given twice in one mapping of an operator's YAML file (`source`), one located line each:
    YAML would silently keep only the last value."""
    if isinstance(node, yaml.MappingNode):
        for key, value, seen in yaml_input.items_with_repeats(node):
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if seen is not None:
                yield (
                    f"{source}:{key.start_mark.line + 1}: {format_loc((*loc, key.value))}: duplicate key "
                    f"(also on line {seen}; only one value may be given)"
                )
            yield from duplicate_keys(value, source, (*loc, name) if name is not None else loc)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from duplicate_keys(item, source, (*loc, index))


def _strategy_entries(data: Mapping[str, Any]) -> list[tuple[int, StrategyConfig]]:
    """The strategy entries of a policy that failed validation, with their indexes, so that their names
    and arguments are checked too and every problem is reported at once: an entry keeps its name and
    arguments even when another of its fields is wrong (`enabled: maybe`), which the schema reports."""
    raw = data.get("strategies")
    if not isinstance(raw, list):
        return []
    entries: list[tuple[int, StrategyConfig]] = []
    for index, item in enumerate(raw):
        if not isinstance(item, Mapping):
            continue
        name, args = item.get("name"), item.get("args", {})
        if isinstance(name, str) and isinstance(args, dict):
            entries.append((index, StrategyConfig(name=name, args=args)))
    return entries


def parse_policy(data: object, source: str = "<policy>", root: yaml.Node | None = None) -> LoadedPolicy:
    """Validate an already-parsed policy document; raises PolicyError with every problem found."""
    if data is None:
        # Most often a ConfigMap key typo or a file emptied by mistake: never silently the defaults.
        raise PolicyError(
            [f"{source}:1: {format_loc(())}: the policy is empty; write `{{}}` to ask for every default"]
        )
    problems: list[str] = list(duplicate_keys(root, source))
    if not isinstance(data, dict):
        problems.append(
            f"{_where(source, root, ())}: {format_loc(())}: the policy must be a YAML mapping, "
            f"got {_yaml_kind(data)}"
        )
        raise PolicyError(problems)
    policy: Policy | None = None
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        problems.extend(_problems(exc, source, root))

    configured: list[ConfiguredStrategy] = []
    seen: set[str] = set()
    entries = list(enumerate(policy.strategies)) if policy is not None else _strategy_entries(data)
    for index, entry in entries:
        loc: tuple[int | str, ...] = ("strategies", index, "name")
        where = _where(source, root, loc)
        spec = get_strategy(entry.name)
        if spec is None:
            known = ", ".join(all_strategies()) or "none"
            name = quoted(entry.name)
            problems.append(f"{where}: {format_loc(loc)}: unknown strategy {name} (known: {known})")
            continue
        if entry.name in seen:
            problems.append(f"{where}: {format_loc(loc)}: strategy {quoted(entry.name)} is listed twice")
            continue
        seen.add(entry.name)
        try:
            args = spec.args_model.model_validate(entry.args)
        except ValidationError as exc:
            problems.extend(_problems(exc, source, root, ("strategies", index, "args")))
            continue
        if entry.enabled:
            configured.append(ConfiguredStrategy(name=entry.name, args=args))
    if problems or policy is None:
        raise PolicyError(problems)
    return LoadedPolicy(policy=policy, strategies=tuple(configured), source=source)


def load_policy(path: str | Path) -> LoadedPolicy:
    """Read and validate a policy file. Raises PolicyError (never a traceback) on any problem."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise PolicyError([f"{source}: cannot read policy: {exc.strerror or exc}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise PolicyError([f"{source}:{line}: not UTF-8 text ({exc.reason})"]) from None
    return loads_policy(text, source)


def loads_policy(text: str, source: str = "<policy>") -> LoadedPolicy:
    if len(text) > MAX_POLICY_CHARS:
        size = f"{len(text):,} characters, more than a policy ever needs ({MAX_POLICY_CHARS:,})"
        raise PolicyError([f"{source}:1: the policy is {size}"])
    try:
        root, data = yaml_input.compose_and_load(text)
    except yaml.YAMLError as exc:
        line, problem = yaml_input.problem_of(exc, text)
        where = f"{source}:{line}" if line is not None else source
        raise PolicyError([f"{where}: YAML syntax error: {clip(problem, 300)}"]) from None
    return parse_policy(data, source, root)


def default_policy() -> LoadedPolicy:
    """The built-in policy used when none is given: policies/default.yaml's values, from the models."""
    return parse_policy({}, "<built-in default policy>")
