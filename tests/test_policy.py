"""The policy file: every problem is one line `FILE:LINE: field.path: message`, and the shipped
policies (policies/, the demo cluster's policy) load as documented."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from rebalancer import rfc3339
from rebalancer.finding_kinds import FINDING_KINDS
from rebalancer.history import Workload
from rebalancer.policy import (
    BUILTIN_DEFAULT_ORDER,
    GuardsConfig,
    LimitsConfig,
    LoadedPolicy,
    PolicyError,
    default_policy,
    format_duration,
    load_policy,
    loads_policy,
    parse_duration,
    parse_policy,
)
from rebalancer.registry import all_strategies
from rebalancer.sources.files import load_snapshot_dir
from rebalancer.workloads import IDLE_SINCE, resolve

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ROOT / "policies"
DEMO = ROOT / "examples" / "demo-cluster"
BUILTIN = ("gpu-affinity", "gpu-consolidation", "gpu-rightsizing", "idle-gpu", "topology-spread")
KNOWN = "known: gpu-affinity, gpu-consolidation, gpu-rightsizing, idle-gpu, topology-spread"
KNOWN_KINDS = "known: " + ", ".join(sorted(FINDING_KINDS))


def problems_of(text: str, source: str = "p.yaml") -> list[str]:
    with pytest.raises(PolicyError) as caught:
        loads_policy(text, source)
    assert str(caught.value) == "\n".join(caught.value.problems)
    return list(caught.value.problems)


def test_builtin_strategies_are_registered() -> None:
    # The strategy-argument cases below run against the real strategy modules.
    assert tuple(all_strategies()) == BUILTIN


# --------------------------------------------------------------------------- bad policies

BAD_POLICIES = [
    pytest.param(
        "dry_run: true\nstrategies: [\n  - name: idle-gpu\n",
        ["p.yaml:3: YAML syntax error: expected the node content, but found '-'"],
        id="yaml-syntax-error-names-its-line",
    ),
    pytest.param(
        "guards:\n  min_pod_age: 10m\n   cooldown: 1h\n",
        ["p.yaml:3: YAML syntax error: mapping values are not allowed here"],
        id="yaml-bad-indentation",
    ),
    pytest.param(
        "dry_run: true\n---\ndry_run: false\n",
        ["p.yaml:2: YAML syntax error: expected a single document in the stream, but found another document"],
        id="yaml-two-documents",
    ),
    pytest.param(
        "- name: idle-gpu\n- name: gpu-consolidation\n",
        ["p.yaml:1: (top level): the policy must be a YAML mapping, got a list"],
        id="top-level-list",
    ),
    pytest.param(
        "dry-run\n",
        ["p.yaml:1: (top level): the policy must be a YAML mapping, got a string"],
        id="top-level-scalar",
    ),
    pytest.param(
        "dry_run: true\ndryrun: false\n",
        ["p.yaml:2: dryrun: unknown field"],
        id="unknown-top-level-field",
    ),
    pytest.param(
        "dry_run: false\ninterval: 5m\ndry_run: true\n",
        ["p.yaml:3: dry_run: duplicate key (also on line 1; only one value may be given)"],
        id="duplicate-key-is-not-silently-overridden",
    ),
    pytest.param(
        "strategies:\n  - name: idle-gpu\n    args:\n      window: 30m\n      window: 2h\n",
        ["p.yaml:5: strategies[0].args.window: duplicate key (also on line 4; only one value may be given)"],
        id="duplicate-strategy-arg",
    ),
    pytest.param(
        "strategies:\n  - name: gpu-affinity\n  - name: idle-gpus\n",
        [f"p.yaml:3: strategies[1].name: unknown strategy 'idle-gpus' ({KNOWN})"],
        id="unknown-strategy-lists-known-ones",
    ),
    pytest.param(
        "strategies:\n  - name: idle-gpu\n  - name: topology-spread\n  - name: idle-gpu\n    enabled: no\n",
        ["p.yaml:4: strategies[2].name: strategy 'idle-gpu' is listed twice"],
        id="strategy-listed-twice",
    ),
    pytest.param(
        "strategies:\n  - enabled: true\n",
        ["p.yaml:2: strategies[0].name: required field is missing"],
        id="strategy-without-name",
    ),
    pytest.param(
        "strategies: gpu-consolidation\n",
        ["p.yaml:1: strategies: Input should be a valid tuple (got 'gpu-consolidation')"],
        id="strategies-not-a-list",
    ),
    pytest.param(
        "strategies:\n  - 42\n",
        ["p.yaml:2: strategies[0]: expected a mapping, got a number"],
        id="strategy-entry-not-a-mapping",
    ),
    pytest.param(
        "strategies:\n  - name: idle-gpu\n    args: [window, 30m]\n",
        ["p.yaml:3: strategies[0].args: expected a mapping, got a list"],
        id="strategy-args-not-a-mapping",
    ),
    pytest.param(
        "strategies:\n  - name: idle-gpu\n  - name: gpu-consolidation\n    args:\n      windw: 1h\n",
        ["p.yaml:5: strategies[1].args.windw: unknown field"],
        id="unknown-strategy-arg",
    ),
    pytest.param(
        'strategies:\n  - name: idle-gpu\n    args:\n      window: "3x"\n',
        [
            "p.yaml:4: strategies[0].args.window: invalid duration '3x': "
            "use a number with a unit, e.g. 30s, 5m, 1h30m"
        ],
        id="bad-duration",
    ),
    pytest.param(
        "guards:\n  min_pod_age: 10 minutes\n",
        [
            "p.yaml:2: guards.min_pod_age: invalid duration '10 minutes': "
            "use a number with a unit, e.g. 30s, 5m, 1h30m"
        ],
        id="duration-in-words",
    ),
    pytest.param(
        "strategies:\n  - name: idle-gpu\n    args:\n      window: -5m\n",
        ["p.yaml:4: strategies[0].args.window: duration must be non-negative, got '-5m'"],
        id="negative-duration",
    ),
    pytest.param(
        "guards:\n  cooldown: -300\n",
        ["p.yaml:2: guards.cooldown: duration must be a finite, non-negative time, got -300"],
        id="negative-duration-in-seconds",
    ),
    pytest.param(
        "strategies:\n  - name: idle-gpu\n    args:\n      window: 0s\n",
        ["p.yaml:4: strategies[0].args.window: Input should be greater than 0 (got 0)"],
        id="zero-window",
    ),
    pytest.param(
        "strategies:\n  - name: gpu-consolidation\n    args:\n      max_allocated_percent: 150\n",
        [
            "p.yaml:4: strategies[0].args.max_allocated_percent: "
            "Input should be less than or equal to 100 (got 150)"
        ],
        id="percent-above-100",
    ),
    pytest.param(
        "strategies:\n  - name: idle-gpu\n    args:\n      max_utilization_percent: -1\n",
        [
            "p.yaml:4: strategies[0].args.max_utilization_percent: "
            "Input should be greater than or equal to 0 (got -1)"
        ],
        id="percent-below-0",
    ),
    pytest.param(
        "strategies:\n  - name: idle-gpu\n    args:\n      max_utilization_percent: .nan\n",
        ["p.yaml:4: strategies[0].args.max_utilization_percent: Input should be a finite number (got nan)"],
        id="nan-percent",
    ),
    pytest.param(
        "strategies:\n  - name: idle-gpu\n    args:\n      leaked_vram_mib: .inf\n",
        ["p.yaml:4: strategies[0].args.leaked_vram_mib: Input should be a finite number (got inf)"],
        id="infinite-mib",
    ),
    pytest.param(
        "dry_run: maybe\n",
        ["p.yaml:1: dry_run: Input should be a valid boolean, unable to interpret input (got 'maybe')"],
        id="wrong-type-for-bool",
    ),
    pytest.param(
        "strategies:\n  - name: gpu-affinity\n    args:\n      preferred: 2\n",
        [
            "p.yaml:4: strategies[0].args.preferred: "
            "Input should be a valid boolean, unable to interpret input (got 2)"
        ],
        id="wrong-type-for-strategy-bool",
    ),
    pytest.param(
        "strategies:\n  - name: idle-gpu\n    args:\n      namespaces: notebooks\n",
        ["p.yaml:4: strategies[0].args.namespaces: Input should be a valid tuple (got 'notebooks')"],
        id="namespace-list-written-as-string",
    ),
    pytest.param(
        "strategies:\n  - name: gpu-consolidation\n    args:\n      packed_schedulers: []\n",
        [
            "p.yaml:4: strategies[0].args.packed_schedulers: "
            "Tuple should have at least 1 item after validation, not 0"
        ],
        id="no-packed-scheduler",
    ),
    pytest.param(
        "strategies:\n  - name: gpu-consolidation\n    args:\n      max_nodes_per_cycle: 0\n",
        [
            "p.yaml:4: strategies[0].args.max_nodes_per_cycle: "
            "Input should be greater than or equal to 1 (got 0)"
        ],
        id="zero-nodes-per-cycle",
    ),
    pytest.param(
        "limits:\n  max_per_node: 4\n  max_per_cycle: 0\n",
        ["p.yaml:3: limits.max_per_cycle: Input should be greater than or equal to 1 (got 0)"],
        id="limits-max-per-cycle-zero",
    ),
    pytest.param(
        "dry_run: true\ninterval: 5s\n",
        ["p.yaml:2: interval: interval must be at least 10s (got '5s')"],
        id="interval-below-10s",
    ),
    pytest.param(
        "guards:\n  priority_threshold: high\n",
        [
            "p.yaml:2: guards.priority_threshold: "
            "Input should be a valid integer, unable to parse string as an integer (got 'high')"
        ],
        id="priority-threshold-not-a-number",
    ),
    pytest.param(
        "guards:\n  namespaces:\n    include: [ml, notebooks]\n    exclude: [kube-system, notebooks]\n",
        ["p.yaml:3: guards.namespaces: namespaces both included and excluded: notebooks"],
        id="namespace-included-and-excluded",
    ),
    pytest.param(
        "guards:\n  label_selector:\n    match_expressions:\n      - key: team\n        operator: In\n",
        ["p.yaml:4: guards.label_selector.match_expressions[0]: operator In needs at least one value"],
        id="selector-in-without-values",
    ),
    pytest.param(
        "guards:\n  label_selector:\n    match_expressions:\n"
        "      - key: team\n        operator: Exists\n        values: [ml]\n",
        ["p.yaml:4: guards.label_selector.match_expressions[0]: operator Exists takes no values"],
        id="selector-exists-with-values",
    ),
    pytest.param(
        "guards:\n  label_selector:\n    match_expressions:\n      - key: team\n        operator: Equals\n",
        [
            "p.yaml:5: guards.label_selector.match_expressions[0].operator: "
            "Input should be 'In', 'NotIn', 'Exists' or 'DoesNotExist' (got 'Equals')"
        ],
        id="selector-unknown-operator",
    ),
    pytest.param(
        "telemetry:\n  utilization:\n    name: DCGM-FI-DEV-GPU-UTIL\n",
        [
            "p.yaml:3: telemetry.utilization.name: "
            "String should match pattern '^[a-zA-Z_:][a-zA-Z0-9_:]*$' (got 'DCGM-FI-DEV-GPU-UTIL')"
        ],
        id="metric-name-invalid",
    ),
    pytest.param(
        "telemetry:\n  fb_used:\n    name: DCGM_FI_DEV_FB_USED\n    scale: 0\n",
        ["p.yaml:4: telemetry.fb_used.scale: Input should be greater than 0 (got 0)"],
        id="metric-scale-zero",
    ),
    pytest.param(
        "telemetry:\n  preset: dcgm\n",
        [
            "p.yaml:2: telemetry.preset: Input should be 'dcgm-exporter', 'dcgm-exporter-legacy', "
            "'dcgm-exporter-exported' or 'nv-gpu' (got 'dcgm')"
        ],
        id="unknown-telemetry-preset",
    ),
    pytest.param(
        "telemetry:\n  prometheus:\n    url: prometheus.monitoring.svc:9090\n",
        [
            "p.yaml:3: telemetry.prometheus.url: "
            "String should match pattern '^https?://' (got 'prometheus.monitoring.svc:9090')"
        ],
        id="prometheus-url-without-scheme",
    ),
    pytest.param(
        "notify:\n  slack:\n    - dashboard_url: https://grafana.example.com/d/gpu\n",
        ["p.yaml:3: notify.slack[0]: set webhook_url_env or webhook_url_file (the URL itself is a secret)"],
        id="slack-sink-without-secret-source",
    ),
    pytest.param(
        "notify:\n  slack:\n    - webhook_url: https://hooks.slack.com/services/T0/B0/x\n",
        ["p.yaml:3: notify.slack[0].webhook_url: unknown field"],
        id="slack-webhook-url-inline-is-refused",
    ),
    pytest.param(
        "notify:\n  webhooks:\n    - url: https://hooks.example.com/gpu\n"
        "      finding_kinds: [leaked-vram, leaked-vrma]\n",
        [
            "p.yaml:4: notify.webhooks[0].finding_kinds[1]: unknown finding kind 'leaked-vrma' "
            "(did you mean 'leaked-vram'?)"
        ],
        id="a-misspelt-finding-kind-would-silence-a-sink",
    ),
    pytest.param(
        "notify:\n  slack:\n    - webhook_url_env: SLACK\n      finding_kinds: [gpu-waste]\n",
        [f"p.yaml:4: notify.slack[0].finding_kinds[0]: unknown finding kind 'gpu-waste' ({KNOWN_KINDS})"],
        id="an-unknown-finding-kind-lists-the-known-ones",
    ),
    pytest.param(
        "prices:\n  per_gpu_hour:\n    NVIDIA-H100-80GB-HBM3: 6.9\n    NVIDIA-L4: -1.5\n",
        ["p.yaml:4: prices.per_gpu_hour.NVIDIA-L4: Input should be greater than or equal to 0 (got -1.5)"],
        id="negative-price",
    ),
    pytest.param(
        "prices:\n  default_per_gpu_hour: -2\n",
        ["p.yaml:2: prices.default_per_gpu_hour: Input should be greater than or equal to 0 (got -2)"],
        id="negative-default-price",
    ),
    pytest.param(
        "gpu_sharing:\n  resources:\n    nvidia.com/gpu.shared:\n      milli_per_unit: 2000\n",
        [
            "p.yaml:4: gpu_sharing.resources.nvidia.com/gpu.shared.milli_per_unit: "
            "Input should be less than or equal to 1000 (got 2000)"
        ],
        id="gpu-share-above-one-device",
    ),
    pytest.param(
        "strategies:\n  - name: gpu-consolidation\n    args:\n"
        "      max_nodes_per_cycle: 99999999999999999999999\n",
        [
            "p.yaml:4: strategies[0].args.max_nodes_per_cycle: "
            "Input should be less than or equal to 1000000000 (got 99999999999999999999999)"
        ],
        id="a-count-past-any-meaning",
    ),
    pytest.param(
        "limits:\n  max_per_cycle: 100000000000\n",
        [
            "p.yaml:2: limits.max_per_cycle: "
            "Input should be less than or equal to 1000000000 (got 100000000000)"
        ],
        id="a-limit-past-any-meaning",
    ),
    pytest.param(
        "strategies:\n  - name: gpu-consolidation\n    args:\n      max_nodes_per_cycle: true\n",
        ["p.yaml:4: strategies[0].args.max_nodes_per_cycle: Input should be a valid integer (got True)"],
        id="a-count-written-as-a-boolean",
    ),
    pytest.param(
        "strategies:\n  - name: gpu-consolidation\n    args:\n      max_allocated_percent: true\n",
        ["p.yaml:4: strategies[0].args.max_allocated_percent: Input should be a valid number (got True)"],
        id="a-percentage-written-as-a-boolean",
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD_POLICIES)
def test_bad_policy_is_reported_with_file_line_path_and_message(text: str, expected: list[str]) -> None:
    assert problems_of(text) == expected


def test_bad_policy_cases_are_plentiful() -> None:
    assert len(BAD_POLICIES) >= 20


def test_several_problems_are_all_listed_at_once() -> None:
    text = (
        "dry_run: yes please\n"  # 1
        "guards:\n"  # 2
        "  min_pod_age: 3x\n"  # 3
        "limits:\n"  # 4
        "  max_per_cycle: 0\n"  # 5
        "strategies:\n"  # 6
        "  - name: idle-gpus\n"  # 7
        "  - name: gpu-consolidation\n"  # 8
        "    args:\n"  # 9
        "      windw: 1h\n"  # 10
        "      max_allocated_percent: 101\n"  # 11
        "  - 42\n"  # 12
    )
    assert problems_of(text) == [
        "p.yaml:1: dry_run: Input should be a valid boolean, unable to interpret input (got 'yes please')",
        "p.yaml:12: strategies[2]: expected a mapping, got a number",
        "p.yaml:3: guards.min_pod_age: invalid duration '3x': use a number with a unit, e.g. 30s, 5m, 1h30m",
        "p.yaml:5: limits.max_per_cycle: Input should be greater than or equal to 1 (got 0)",
        f"p.yaml:7: strategies[0].name: unknown strategy 'idle-gpus' ({KNOWN})",
        "p.yaml:11: strategies[1].args.max_allocated_percent: "
        "Input should be less than or equal to 100 (got 101)",
        "p.yaml:10: strategies[1].args.windw: unknown field",
    ]


def test_disabled_strategy_arguments_are_still_checked() -> None:
    text = "strategies:\n  - name: topology-spread\n    enabled: false\n    args:\n      include_sof: true\n"
    assert problems_of(text) == ["p.yaml:5: strategies[0].args.include_sof: unknown field"]


def test_problem_lines_name_the_file_they_came_from(tmp_path: Path) -> None:
    path = tmp_path / "team-a.yaml"
    path.write_text("dry_run: false\nlimits:\n  max_per_namespace: 0\n", encoding="utf-8")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert caught.value.problems == (
        f"{path}:3: limits.max_per_namespace: Input should be greater than or equal to 1 (got 0)",
    )


def test_missing_file_is_one_problem_line(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert caught.value.problems == (f"{path}: cannot read policy: No such file or directory",)


def test_unreadable_file_is_one_problem_line(tmp_path: Path) -> None:
    # A directory given where a file is expected cannot be read, whoever runs the tests.
    with pytest.raises(PolicyError) as caught:
        load_policy(tmp_path)
    assert caught.value.problems == (f"{tmp_path}: cannot read policy: Is a directory",)


def test_non_utf8_file_names_the_line_of_the_bad_byte(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("dry_run: true\n# owner: Zoë\nguards: {}\n".encode("latin-1"))
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert caught.value.problems == (f"{path}:2: not UTF-8 text (invalid continuation byte)",)


def test_utf8_with_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbfdry_run: true\ninterval: 1m\n")
    assert load_policy(path).policy.interval == 60


def test_parse_policy_without_yaml_nodes_still_names_the_field() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy({"limits": {"max_per_cycle": -1}}, "inline")
    assert caught.value.problems == (
        "inline: limits.max_per_cycle: Input should be greater than or equal to 1 (got -1)",
    )


# --------------------------------------------------------------------------- good policies


@pytest.mark.parametrize("text", ["", "\n", "# nothing configured yet\n", "---\n", "null\n"])
def test_an_empty_policy_is_refused_naming_the_way_to_ask_for_defaults(text: str) -> None:
    """An empty file is most often a ConfigMap key typo: running silently on defaults hides it."""
    assert problems_of(text, "empty.yaml") == [
        "empty.yaml:1: (top level): the policy is empty; write `{}` to ask for every default"
    ]


def test_an_empty_mapping_asks_for_every_default() -> None:
    loaded = loads_policy("{}\n", "defaults.yaml")
    assert loaded.source == "defaults.yaml"
    assert loaded.policy.dry_run is True
    assert loaded.policy.interval == 300
    assert [s.name for s in loaded.strategies] == list(BUILTIN_DEFAULT_ORDER)
    assert loaded.policy.guards.evict_bare_pods is False
    assert loaded.policy.guards.evict_local_storage is False


def test_the_built_in_defaults_are_the_shipped_default_policy() -> None:
    """Running without --policy, writing `{}`, or leaving a section out all mean policies/default.yaml."""
    shipped = load_policy(POLICIES / "default.yaml")
    for builtin in (default_policy(), loads_policy("{}")):
        assert builtin.policy.model_dump(exclude={"strategies"}) == shipped.policy.model_dump(
            exclude={"strategies"}
        )
        assert [(s.name, s.args) for s in builtin.strategies] == [
            (s.name, s.args) for s in shipped.strategies
        ]
    # Section by section: a policy that sets only one field keeps the shipped values of the others.
    partial = loads_policy("limits:\n  max_per_cycle: 3\n")
    assert partial.policy.limits.max_per_node == shipped.policy.limits.max_per_node
    assert partial.policy.guards == shipped.policy.guards


def test_a_strategy_with_a_bad_field_still_has_its_arguments_checked() -> None:
    text = (
        "strategies:\n"  # 1
        "  - name: idle-gpu\n"  # 2
        "    enabled: maybe\n"  # 3
        "    args:\n"  # 4
        "      window: 3x\n"  # 5
        "      windw: 1h\n"  # 6
    )
    assert problems_of(text) == [
        "p.yaml:3: strategies[0].enabled: Input should be a valid boolean, unable to interpret input "
        "(got 'maybe')",
        "p.yaml:5: strategies[0].args.window: invalid duration '3x': use a number with a unit, e.g. 30s, 5m, "
        "1h30m",
        "p.yaml:6: strategies[0].args.windw: unknown field",
    ]


def test_a_yaml_alias_bomb_is_refused_at_once() -> None:
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for level in "bcdefghi":
        previous = chr(ord(level) - 1)
        lines.append(f"{level}: &{level} [{', '.join([f'*{previous}'] * 10)}]")
    started = time.perf_counter()
    [problem] = problems_of("\n".join(lines) + "\n")
    assert time.perf_counter() - started < 5
    assert problem.startswith("p.yaml:4: YAML syntax error: aliases repeat more than 10000 nodes")


def test_a_recursive_alias_is_refused() -> None:
    assert problems_of("guards: &g\n  namespaces: *g\n") == [
        "p.yaml:2: YAML syntax error: alias *g refers to a collection that contains it"
    ]


@pytest.mark.parametrize("depth", [150, 5000])
def test_deep_nesting_is_refused_not_a_recursion_error(depth: int) -> None:
    [problem] = problems_of("strategies: " + "[" * depth + "]" * depth + "\n")
    assert problem.startswith("p.yaml:1: YAML syntax error: ")
    assert "nest" in problem


def test_a_timestamp_in_a_policy_is_a_string_not_a_crash() -> None:
    loaded = loads_policy("guards:\n  label_selector:\n    match_labels: {rollout: 2026-02-30T00:00:00Z}\n")
    selector = loaded.policy.guards.label_selector
    assert selector is not None
    assert selector.match_labels == {"rollout": "2026-02-30T00:00:00Z"}


@pytest.mark.parametrize(
    ("written", "seconds"),
    [
        (90, 90),
        ("45s", 45),
        ("5m", 300),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("1d", 86400),
        ("2w", 1_209_600),
        ("1h0m30s", 3630),
        ("1500ms", 2),
        (" 10m ", 600),
    ],
)
def test_durations_parse(written: object, seconds: int) -> None:
    assert parse_duration(written) == seconds


@pytest.mark.parametrize("written", ["", "3x", "5 m", "m5", "1h-30m", True, None, [5], float("nan"), -1])
def test_bad_durations_are_refused(written: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(written)


@pytest.mark.parametrize("written", ["\uff11h", "\u0665m", "1\uff10s", "\u00b2s"])
def test_durations_in_digits_other_than_ascii_are_refused(written: str) -> None:
    # Full-width or Arabic-Indic digits are no duration any Kubernetes or Prometheus component writes
    # (Go reads ASCII digits only); reading "\uff11h" as an hour would be a silent surprise.
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(written)


@pytest.mark.parametrize("written", ["99999999999w", "3651d", 10**12, 1e300, "1" * 400 + "s", 10**400])
def test_durations_past_ten_years_are_refused_not_an_overflow(written: object) -> None:
    with pytest.raises(ValueError, match="longer than 3650d"):
        parse_duration(written)
    assert parse_duration("3650d") == 3650 * 86400


@pytest.mark.parametrize(("written", "field"), [("10:00", "guards.min_pod_age"), ("1:30", "interval")])
def test_a_clock_time_is_no_duration(written: str, field: str) -> None:
    # YAML 1.1 reads 10:00 as the base-60 integer 600 (and 1:30 as 90): ten minutes or ten hours, a
    # guess either way. Kubernetes' YAML reads it as a string, and so does this.
    section, _, key = field.rpartition(".")
    text = f"{section}:\n  {key}: {written}\n" if section else f"{key}: {written}\n"
    [problem] = problems_of(text)
    line = 2 if section else 1
    assert problem == (
        f"p.yaml:{line}: {field}: invalid duration {written!r}: use a number with a unit, e.g. 30s, 5m, 1h30m"
    )


def test_an_overflowing_duration_in_a_policy_is_a_located_error() -> None:
    [problem] = problems_of("guards:\n  cooldown: 99999999999w\n")
    assert problem.startswith("p.yaml:2: guards.cooldown: duration ")
    assert "longer than 3650d" in problem


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("prices:\n  per_gpu_hour: {NVIDIA-L4: 1e308}\n", "prices.per_gpu_hour.NVIDIA-L4"),
        ("prices:\n  default_per_gpu_hour: 1e308\n", "prices.default_per_gpu_hour"),
    ],
)
def test_a_gpu_price_no_gpu_has_is_a_located_error_not_infinite_savings(text: str, field: str) -> None:
    # 1e308 an hour times a few GPU-hours is Infinity, which JSON cannot carry.
    [problem] = problems_of(text)
    assert problem.startswith(f"p.yaml:2: {field}: "), problem
    assert "less than or equal to 10000" in problem


@pytest.mark.parametrize(("seconds", "text"), [(5400, "90m"), (3600, "1h"), (86400, "1d"), (45, "45s")])
def test_format_duration_round_trips(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


def test_durations_in_a_policy_become_seconds() -> None:
    loaded = loads_policy(
        "interval: 1h30m\nguards:\n  min_pod_age: 90s\n  cooldown: 1d\n"
        "strategies:\n  - name: idle-gpu\n    args:\n      window: 1h30m\n      min_pod_age: 2h\n"
    )
    assert loaded.policy.interval == 5400
    assert loaded.policy.guards.min_pod_age == 90
    assert loaded.policy.guards.cooldown == 86400
    (idle,) = loaded.strategies
    assert idle.args.model_dump()["window"] == 5400
    assert idle.args.model_dump()["min_pod_age"] == 7200


def test_yaml_anchors_and_merge_keys_are_not_duplicates() -> None:
    loaded = loads_policy(
        "strategies:\n"
        "  - name: idle-gpu\n"
        "    args: &common\n"
        "      window: 1h\n"
        "  - name: gpu-consolidation\n"
        "    args:\n"
        "      <<: *common\n"
        "      max_nodes_per_cycle: 2\n"
    )
    idle, consolidation = (s.args.model_dump() for s in loaded.strategies)
    assert idle["window"] == consolidation["window"] == 3600
    assert consolidation["max_nodes_per_cycle"] == 2


def test_disabled_strategies_are_excluded_but_order_is_kept() -> None:
    loaded = loads_policy(
        "strategies:\n"
        "  - name: gpu-affinity\n"
        "  - name: idle-gpu\n    enabled: false\n"
        "  - name: topology-spread\n"
        "  - name: gpu-consolidation\n    enabled: false\n"
    )
    assert [s.name for s in loaded.strategies] == ["gpu-affinity", "topology-spread"]
    assert [s.name for s in loaded.policy.strategies] == [
        "gpu-affinity",
        "idle-gpu",
        "topology-spread",
        "gpu-consolidation",
    ]


def test_telemetry_windows_collects_every_enabled_strategy_window() -> None:
    loaded = loads_policy(
        "strategies:\n"
        "  - name: idle-gpu\n    args: {window: 30m}\n"
        "  - name: gpu-consolidation\n    args: {window: 1h}\n"
        "  - name: gpu-affinity\n"
    )
    assert loaded.telemetry_windows() == frozenset({1800, 3600})


def test_telemetry_windows_skip_disabled_and_allocation_only_strategies() -> None:
    loaded = loads_policy(
        "strategies:\n"
        "  - name: idle-gpu\n    enabled: false\n    args: {window: 45m}\n"
        "  - name: gpu-consolidation\n    args: {window: 2h, max_utilization_percent: null}\n"
    )
    assert loaded.telemetry_windows() == frozenset()


def test_shared_windows_are_listed_once() -> None:
    loaded = loads_policy(
        "strategies:\n"
        "  - name: idle-gpu\n    args: {window: 1h}\n"
        "  - name: gpu-consolidation\n    args: {window: 60m}\n"
    )
    assert loaded.telemetry_windows() == frozenset({3600})


def test_builtin_default_policy_runs_every_strategy_in_dry_run() -> None:
    loaded = default_policy()
    assert loaded.policy.dry_run is True
    assert [s.name for s in loaded.strategies] == [
        "gpu-affinity",
        "idle-gpu",
        "topology-spread",
        "gpu-consolidation",
    ]


# --------------------------------------------------------------------------- shipped policies


def shipped_policies() -> list[Path]:
    return [*sorted(POLICIES.rglob("*.yaml")), DEMO / "policy.yaml"]


@pytest.mark.parametrize("path", shipped_policies(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_policy_validates(path: Path) -> None:
    loaded = load_policy(path)
    assert loaded.strategies
    assert loaded.policy.dry_run is True, "shipped policies start in dry-run"


def test_the_shipped_set_is_complete() -> None:
    assert {p.relative_to(POLICIES).as_posix() for p in POLICIES.rglob("*.yaml")} == {
        "default.yaml",
        "examples/gpu-low-node-utilization.yaml",
        "examples/namespace-priority-filters.yaml",
        "examples/node-affinity-violations.yaml",
        "examples/topology-spread.yaml",
    }


def load_default() -> LoadedPolicy:
    return load_policy(POLICIES / "default.yaml")


def test_default_policy_is_safe() -> None:
    loaded = load_default()
    policy = loaded.policy
    assert policy.dry_run is True
    assert [s.name for s in loaded.strategies] == [
        "gpu-affinity",
        "idle-gpu",
        "topology-spread",
        "gpu-consolidation",
    ]
    idle = next(s for s in loaded.strategies if s.name == "idle-gpu")
    assert idle.args.model_dump()["namespaces"] == (), "idle-gpu ships report-only"
    assert {"kube-system", "gpu-operator"} <= set(policy.guards.namespaces.exclude)
    assert policy.guards.evict_bare_pods is False
    assert policy.guards.evict_local_storage is False
    assert policy.limits.max_per_cycle is not None
    assert loaded.telemetry_windows() == frozenset({1800, 3600})


def test_default_policy_writes_guards_and_limits_out_in_full() -> None:
    raw = yaml.safe_load((POLICIES / "default.yaml").read_text(encoding="utf-8"))
    assert set(raw["guards"]) == set(GuardsConfig.model_fields)
    assert set(raw["limits"]) == set(LimitsConfig.model_fields)
    for entry in raw["strategies"]:
        spec = all_strategies()[entry["name"]]
        assert set(entry["args"]) == set(spec.args_model.model_fields), entry["name"]


def test_default_policy_prices_every_gpu_model_of_the_demo_cluster() -> None:
    prices = load_default().policy.prices.per_gpu_hour
    nodes = json.loads((DEMO / "nodes.json").read_text(encoding="utf-8"))["items"]
    models = {n["metadata"]["labels"].get("nvidia.com/gpu.product") for n in nodes} - {None}
    assert models
    assert models <= set(prices)


@pytest.mark.parametrize(
    ("name", "strategy"),
    [
        ("gpu-low-node-utilization.yaml", "gpu-consolidation"),
        ("node-affinity-violations.yaml", "gpu-affinity"),
        ("topology-spread.yaml", "topology-spread"),
        ("namespace-priority-filters.yaml", "gpu-affinity"),
    ],
)
def test_examples_translate_an_upstream_descheduler_policy(name: str, strategy: str) -> None:
    path = POLICIES / "examples" / name
    text = path.read_text(encoding="utf-8")
    header = text.split("\n\n", 1)[0]
    assert all(line.startswith("#") for line in header.splitlines()), "starts with a comment block"
    comments = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert 'apiVersion: "descheduler/v1alpha2"' in comments
    assert 'kind: "DeschedulerPolicy"' in comments
    assert "What we do better" in comments
    assert strategy in [s.name for s in load_policy(path).strategies]


def test_namespace_priority_example_maps_filters_to_guards() -> None:
    guards = load_policy(POLICIES / "examples" / "namespace-priority-filters.yaml").policy.guards
    assert guards.priority_threshold == 100000
    assert guards.namespaces.include == ("ml-training", "ml-batch", "notebooks")
    assert guards.label_selector is not None
    (requirement,) = guards.label_selector.match_expressions
    assert (requirement.key, requirement.operator, requirement.values) == (
        "gpu-rebalancer.io/evictable",
        "NotIn",
        ("false",),
    )


# --------------------------------------------------------------------------- demo cluster


def test_demo_policy_is_the_default_plus_the_notebooks_reclaim() -> None:
    default = load_default()
    demo = load_policy(DEMO / "policy.yaml")
    assert demo.policy.model_dump(exclude={"strategies"}) == default.policy.model_dump(exclude={"strategies"})
    assert [s.name for s in demo.strategies] == [s.name for s in default.strategies]
    for mine, theirs in zip(demo.strategies, default.strategies, strict=True):
        expected = theirs.args.model_dump()
        if mine.name == "idle-gpu":
            expected["actions"] = (
                {"action": "reclaim", "namespaces": ("notebooks",), "selector": None, "grace": 4 * 3600},
            )
        assert mine.args.model_dump() == expected, mine.name


def test_demo_cluster_files_are_what_the_generator_writes(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(DEMO / "generate.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == [
        "dcgm.om",
        "nodes.json",
        "pdbs.json",
        "pods.json",
        "policy.yaml",
        "snapshot.yaml",
        "workloads.json",
    ]
    for name in written:
        assert (tmp_path / name).read_bytes() == (DEMO / name).read_bytes(), (
            f"{name} is stale: rerun generate.py"
        )


def test_every_demo_pod_resolves_to_the_controller_behind_it() -> None:
    """The demo's workloads.json holds every controller of its pods that the rebalancer reads (all but the
    GPU Operator's DaemonSets), and alice's notebook was found idle five hours before `now`."""
    snapshot = load_snapshot_dir(DEMO, load_policy(DEMO / "policy.yaml"))
    resolved = resolve(snapshot)
    unresolved = {(r.key.namespace, r.key.kind) for r in resolved.values() if r.controller is None}
    assert unresolved == {("gpu-operator", "DaemonSet")}
    assert not [f for f in snapshot.findings if f.kind == "ignored-objects"]
    alice = resolved[("notebooks", "alice-llm-playground-0")]
    assert alice.key == Workload("notebooks", "StatefulSet", "alice-llm-playground")
    assert alice.controller is not None and alice.reclaim == "scale"
    idle_since = alice.controller.annotations[IDLE_SINCE]
    assert idle_since == "2026-11-29T07:00:00Z"
    assert rfc3339.parse(idle_since) == snapshot.now - timedelta(hours=5)
    bob = resolved[("notebooks", "bob-eval-harness-0")].controller
    assert bob is not None and IDLE_SINCE not in bob.annotations
    serve = {r.key for key, r in resolved.items() if key[1].startswith("llm-serve-")}
    assert serve == {Workload("inference", "Deployment", "llm-serve")}
    llm_serve = snapshot.controllers[("inference", "Deployment", "llm-serve")]
    assert llm_serve.replicas == 4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("interval: !!int abc\n", "p.yaml:1: YAML syntax error: cannot read 'abc' as int"),
        ("interval: !!float x\n", "p.yaml:1: YAML syntax error: cannot read 'x' as float"),
    ],
)
def test_a_value_its_explicit_tag_cannot_hold_is_a_located_error(text: str, expected: str) -> None:
    [problem] = problems_of(text)
    assert problem.startswith(expected)


def test_an_explicit_timestamp_tag_stays_a_string() -> None:
    loaded = loads_policy(
        "guards:\n  label_selector:\n    match_labels: {at: !!timestamp 2026-02-30T00:00:00Z}\n"
    )
    selector = loaded.policy.guards.label_selector
    assert selector is not None and selector.match_labels == {"at": "2026-02-30T00:00:00Z"}


def test_a_huge_value_is_echoed_cut_short() -> None:
    [problem] = problems_of(f"dry_run: {'x' * 100_000}\n")
    assert len(problem) < 400
    assert "more characters" in problem
    [problem] = problems_of(f"strategies:\n  - name: {'y' * 100_000}\n")
    assert len(problem) < 400


def test_a_policy_of_megabytes_is_refused_before_it_is_parsed() -> None:
    started = time.perf_counter()
    [problem] = problems_of("strategies:\n" + "  - {name: idle-gpu}\n" * 100_000)
    assert time.perf_counter() - started < 2
    assert problem.startswith("p.yaml:1: the policy is 2,100,012 characters, more than a policy ever needs")


def test_a_control_character_is_one_located_line() -> None:
    [problem] = problems_of("dry_run: true\n---\x00\n")
    assert (
        problem
        == "p.yaml:2: YAML syntax error: unacceptable character #x0000: special characters are not allowed"
    )
