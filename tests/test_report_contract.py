"""The report's additive contract: schema version, the policy that judged (name, digest), the source
of the snapshot (never a credential), the blocked count per guard; DESIGN §7's keys unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rebalancer.cli import build_parser, main
from rebalancer.daemon.wiring import live_source_description
from rebalancer.policy import load_policy, loads_policy
from rebalancer.report import SCHEMA_VERSION
from tests.builders import replace

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo-cluster"
DEMO_POLICY = DEMO / "policy.yaml"


def demo_json(capsys: pytest.CaptureFixture[str], policy: Path = DEMO_POLICY) -> dict[str, object]:
    assert main(["once", "--snapshot", str(DEMO), "--policy", str(policy), "--output", "json"]) == 0
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


def test_the_json_report_names_its_schema_source_and_policy(capsys: pytest.CaptureFixture[str]) -> None:
    data = demo_json(capsys)
    assert data["schema_version"] == SCHEMA_VERSION == 1
    assert data["source"] == f"snapshot {DEMO}"
    assert data["policy"] == {"name": "policy.yaml", "digest": load_policy(DEMO_POLICY).digest}
    summary = data["summary"]
    assert isinstance(summary, dict)
    # The demo's refusals: a PDB (a drain of two pods) and an opted-out pod, as the text shows them.
    assert summary["blocked_by"] == {"opt-out": 1, "pdb": 2}
    assert sum(summary["blocked_by"].values()) == summary["blocked"]


def test_the_digest_is_of_the_policy_values_not_of_its_spelling() -> None:
    plain = loads_policy("interval: 5m\nstrategies:\n- name: idle-gpu\n")
    respelled = loads_policy("# a comment\nstrategies: [{name: idle-gpu}]\ninterval: 300\n")
    changed = loads_policy("interval: 10m\nstrategies:\n- name: idle-gpu\n")
    assert plain.digest == respelled.digest
    assert plain.digest != changed.digest
    assert plain.digest.startswith("sha256:") and len(plain.digest) == len("sha256:") + 64


def test_the_built_in_policy_is_named_as_such() -> None:
    assert loads_policy("{}", "<built-in default policy>").name == "<built-in default policy>"


@pytest.mark.parametrize(
    ("flags", "described"),
    [
        (["--context", "prod"], "live cluster (context prod)"),
        (["--kubeconfig", "kube.yaml"], "live cluster (the kubeconfig's current context)"),
        ([], "live cluster (in-cluster, else the kubeconfig's current context)"),
    ],
)
def test_a_live_source_is_named_by_its_context_only(flags: list[str], described: str) -> None:
    args = build_parser().parse_args(["once", *flags, "--prometheus-url", "http://user:secret@prom:9090"])
    assert live_source_description(args) == described
    assert "secret" not in live_source_description(args)


def test_the_json_report_carries_every_gpu_node_as_a_row_of_its_gpus(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rebalancer.sources.files import load_snapshot_dir

    data = demo_json(capsys)
    snapshot = load_snapshot_dir(DEMO, load_policy(DEMO_POLICY))
    rows = data["gpu_nodes"]
    assert isinstance(rows, list)
    # Every node with whole GPUs, by name, each with as many GPUs as it advertises.
    expected = {name: n.gpu_count for name, n in snapshot.nodes.items() if n.gpu_count > 0}
    assert [row["node"] for row in rows] == sorted(expected)
    assert {row["node"]: len(row["gpus"]) for row in rows} == expected
    assert all(row["gpu_model"] == snapshot.nodes[row["node"]].gpu_model for row in rows)
    cells = [(row["node"], gpu) for row in rows for gpu in row["gpus"]]
    assert {key for _, gpu in cells for key in gpu} == {
        "index",
        "state",
        "pods",
        "uuid",
        "util_avg_percent",
        "fb_used_mib",
    }
    assert {gpu["state"] for _, gpu in cells} <= {"busy", "idle", "leaked", "free", "unknown"}
    # A pod on a GPU is a pod of the snapshot on that node; a free GPU holds none.
    for node_name, gpu in cells:
        for ref in gpu["pods"]:
            namespace, name = ref.split("/")
            assert snapshot.pods_by_key[(namespace, name)].node_name == node_name
        assert (gpu["state"] == "free") == (not gpu["pods"] and gpu["state"] != "leaked")
    # The GPUs drawn leaked are the ones the report's leaked-vram findings name.
    findings = data["findings"]
    assert isinstance(findings, list)
    leaked = {f["gpu"] for f in findings if f["kind"] == "leaked-vram"}
    assert leaked and {gpu["uuid"] for _, gpu in cells if gpu["state"] == "leaked"} == leaked


def test_the_json_text_is_what_the_standard_library_writes(tmp_path: Path) -> None:
    """`to_json` formats as `json.dumps(indent=2)` does: the demo byte for byte, and a report carrying
    non-ASCII and hostile text decodes to the same document (UTF-8 rather than `\\u` escapes)."""

    from rebalancer.cycle import run_cycle
    from rebalancer.evictor import DryRunEvictor
    from rebalancer.model import Finding
    from rebalancer.report import to_dict, to_json
    from rebalancer.sources.files import load_snapshot_dir

    loaded = load_policy(DEMO_POLICY)
    report = run_cycle(load_snapshot_dir(DEMO_POLICY.parent, loaded), loaded, DryRunEvictor())
    assert to_json(report) == json.dumps(to_dict(report), indent=2)
    odd = Finding(kind="bad-telemetry", detail='Zürich "GPU" \\ </script>\u2028 \U0001f525 \x00', gpus=1e-05)
    hostile = replace(report, findings=(*report.findings, odd))
    assert json.loads(to_json(hostile)) == json.loads(json.dumps(to_dict(hostile), indent=2))


def test_not_chosen_counts_are_per_strategy_in_report_order_most_frequent_code_first() -> None:
    """Strategies in the order of their first record; within one, codes by count, then by name; at most
    TOP_REASONS of them, the count of every record beside."""
    from types import SimpleNamespace

    from rebalancer.model import NotChosen
    from rebalancer.report import TOP_REASONS, not_chosen_counts

    records = [
        ("b", "x"), ("a", "y"), ("b", "y"), ("b", "x"), ("a", "y"), ("a", "z"), ("b", "w"),
    ]  # fmt: skip
    many = [("c", f"code-{index}") for index in range(TOP_REASONS + 2)]
    report = SimpleNamespace(not_chosen=[NotChosen(s, "n1", code, "why") for s, code in records + many])
    counts = not_chosen_counts(report)  # type: ignore[arg-type]
    assert list(counts) == ["b", "a", "c"]
    assert counts["b"] == (4, [("x", 2), ("w", 1), ("y", 1)])
    assert counts["a"] == (3, [("y", 2), ("z", 1)])
    assert counts["c"][0] == TOP_REASONS + 2 and len(counts["c"][1]) == TOP_REASONS
