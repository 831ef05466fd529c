"""Snapshots that carry aggregates: telemetry-windows.json, written from the raw history and read back.

Loaded rows are compared with rows computed from the raw history by `telemetry.windows.aggregate`, on
the demo cluster and on the DCGM fixtures; rows that do not fit the policy or the snapshot are not
used (a finding says why, and the raw history is read instead); a malformed file names file and field.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer.cli import main
from rebalancer.errors import InputError
from rebalancer.model import GpuTelemetry, Snapshot
from rebalancer.policy import LoadedPolicy, load_policy
from rebalancer.sources.files import (
    AGGREGATES_UNUSED,
    SnapshotError,
    aggregate_snapshot_dir,
    load_snapshot_dir,
)
from rebalancer.sources.telemetry_aggregates import (
    AGGREGATES_FILE,
    _FastRow,
    _read_fast,
    _read_validated,
    read_aggregates,
    write_aggregates,
)
from tests.builders import NOW
from tests.test_files_source import SAMPLES, T0, UUID, kinds, kube_list, loaded, node, pod, write

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "demo-cluster"
DEMO_POLICY = DEMO / "policy.yaml"


def _demo_policy() -> LoadedPolicy:
    return load_policy(DEMO_POLICY)


def _raw_copy(source: Path, target: Path) -> Path:
    """`source` without its aggregates: what the files source reads from raw history alone."""
    shutil.copytree(source, target)
    (target / AGGREGATES_FILE).unlink(missing_ok=True)
    return target


def _same_telemetry(ours: Snapshot, theirs: Snapshot) -> None:
    assert ours.now == theirs.now
    assert ours.telemetry == theirs.telemetry
    assert ours.findings == theirs.findings


# --------------------------------------------------------------------------- the demo


def test_the_demo_carries_the_rows_its_raw_history_gives() -> None:
    held = read_aggregates(DEMO / AGGREGATES_FILE, (DEMO / AGGREGATES_FILE).read_bytes())
    computed = aggregate_snapshot_dir(DEMO, _demo_policy())
    assert held == computed
    assert sorted(held.windows) == sorted(_demo_policy().telemetry_windows())
    assert sum(len(w.gpus) for w in held.windows.values()) > 0


def test_the_demo_aggregates_file_is_what_rebalancer_aggregate_writes(tmp_path: Path) -> None:
    copy = _raw_copy(DEMO, tmp_path / "demo")
    assert main(["aggregate", "--snapshot", str(copy), "--policy", str(DEMO_POLICY)]) == 0
    assert (copy / AGGREGATES_FILE).read_bytes() == (DEMO / AGGREGATES_FILE).read_bytes(), (
        f"{AGGREGATES_FILE} is stale: rerun rebalancer aggregate --snapshot examples/demo-cluster "
        "--policy examples/demo-cluster/policy.yaml"
    )


def test_the_demo_loads_the_same_from_aggregates_and_from_raw(tmp_path: Path) -> None:
    from_aggregates = load_snapshot_dir(DEMO, load_policy(DEMO / "policy.yaml"))
    raw = _raw_copy(DEMO, tmp_path / "raw")
    from_raw = load_snapshot_dir(raw, load_policy(raw / "policy.yaml"))
    _same_telemetry(from_aggregates, from_raw)
    assert AGGREGATES_UNUSED not in kinds(from_aggregates.findings)


def test_the_raw_history_is_not_read_when_the_aggregates_fit(tmp_path: Path) -> None:
    copy = tmp_path / "demo"
    shutil.copytree(DEMO, copy)
    (copy / "dcgm.om").write_text("this is not an exposition\n", encoding="utf-8")
    snapshot = load_snapshot_dir(copy, _demo_policy())
    assert snapshot.telemetry == load_snapshot_dir(DEMO, _demo_policy()).telemetry


# --------------------------------------------------------------------------- the DCGM fixtures


# The fixtures holding series the cycle reads (readme-kubernetes.prom holds none: nothing to aggregate).
_READ = ("DCGM_FI_DEV_GPU_UTIL{", "DCGM_FI_DEV_FB_USED{", "DCGM_FI_DEV_FB_FREE{")
DCGM_FIXTURES = sorted(
    p.name for p in SAMPLES.glob("*.prom") if any(metric in p.read_text() for metric in _READ)
)


def test_the_dcgm_fixtures_are_found() -> None:
    assert len(DCGM_FIXTURES) >= 2


@pytest.mark.parametrize("fixture", DCGM_FIXTURES)
def test_fixture_rows_round_trip(tmp_path: Path, fixture: str) -> None:
    shutil.copy(SAMPLES / fixture, tmp_path / fixture)
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")  # the samples carry no timestamp
    from_raw = load_snapshot_dir(tmp_path, loaded())
    computed = aggregate_snapshot_dir(tmp_path, loaded())
    write_aggregates(tmp_path / AGGREGATES_FILE, computed)
    held = read_aggregates(tmp_path / AGGREGATES_FILE, (tmp_path / AGGREGATES_FILE).read_bytes())
    assert held == computed
    assert sum(len(w.gpus) for w in held.windows.values()) > 0
    _same_telemetry(load_snapshot_dir(tmp_path, loaded()), from_raw)


def _with_bad_samples(root: Path) -> None:
    write(root, "c.json", kube_list(node("n1"), pod("train-0", "n1")))
    lines = [
        f'DCGM_FI_DEV_GPU_UTIL{{Hostname="n1",UUID="{UUID}",namespace="ml",pod="train-0"}} {v} {T0 - age}'
        for age, v in ((20, "NaN"), (10, "-3"), (0, "40"))
    ]
    lines.append(f'DCGM_FI_DEV_FB_USED{{UUID="{UUID}"}} 100 {T0}')  # no node label
    write(root, "m.om", "\n".join(lines) + "\n# EOF\n")
    write(root, "snapshot.yaml", f"now: {NOW.isoformat()}\n")


def test_findings_and_pods_round_trip(tmp_path: Path) -> None:
    _with_bad_samples(tmp_path)
    from_raw = load_snapshot_dir(tmp_path, loaded())
    assert kinds(from_raw.findings) == ["bad-telemetry", "unusable-telemetry"]
    write_aggregates(tmp_path / AGGREGATES_FILE, aggregate_snapshot_dir(tmp_path, loaded()))
    (tmp_path / "m.om").unlink()  # the rows alone stand for it
    from_aggregates = load_snapshot_dir(tmp_path, loaded())
    _same_telemetry(from_aggregates, from_raw)
    window = from_aggregates.telemetry.window(600)
    assert window is not None
    assert [(g.pod_name, g.util_avg_percent) for g in window.gpus] == [("train-0", 40.0)]


def test_a_framebuffer_held_by_a_pod_the_view_does_not_have_round_trips(tmp_path: Path) -> None:
    # The pod list has train-0; new-0 started since, and its series holds the GPU's newest framebuffer.
    write(tmp_path, "c.json", kube_list(node("n1"), pod("train-0", "n1")))
    write(
        tmp_path,
        "m.om",
        f'DCGM_FI_DEV_FB_USED{{Hostname="n1",UUID="{UUID}"}} 0 {T0 - 60}\n'
        f'DCGM_FI_DEV_FB_USED{{Hostname="n1",UUID="{UUID}",namespace="ml",pod="new-0"}} 30000 {T0}\n'
        "# EOF\n",
    )
    write(tmp_path, "snapshot.yaml", f"now: {NOW.isoformat()}\n")
    from_raw = load_snapshot_dir(tmp_path, loaded())
    write_aggregates(tmp_path / AGGREGATES_FILE, aggregate_snapshot_dir(tmp_path, loaded()))
    (tmp_path / "m.om").unlink()
    written = (tmp_path / AGGREGATES_FILE).read_bytes()
    assert written.count(b'"fb_used_by_unseen_pod": true') == len(from_raw.telemetry.windows)
    from_aggregates = load_snapshot_dir(tmp_path, loaded())
    _same_telemetry(from_aggregates, from_raw)
    for window in from_aggregates.telemetry.windows.values():
        assert [(g.pod_key, g.fb_used_by_unseen_pod) for g in window.gpus] == [(None, True)]
    # Both readers read the flag alike.
    assert _read_fast(written) == _read_validated(tmp_path / AGGREGATES_FILE, written)


# --------------------------------------------------------------------------- rows that do not fit


def _aggregated(root: Path) -> None:
    _with_bad_samples(root)
    write_aggregates(root / AGGREGATES_FILE, aggregate_snapshot_dir(root, loaded()))


def _edit(root: Path, change: Any) -> None:
    doc = json.loads((root / AGGREGATES_FILE).read_text(encoding="utf-8"))
    change(doc)
    (root / AGGREGATES_FILE).write_text(json.dumps(doc), encoding="utf-8")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda doc: doc.update(now="2026-11-29T11:00:00Z"), "computed for now 2026-11-29T11:00:00.000Z"),
        (lambda doc: doc.update(windows=doc["windows"][:1]), "the policy's windows 600s are not held"),
        (lambda doc: doc["telemetry"]["utilization"].update(name="X"), "telemetry.utilization differ"),
        (lambda doc: doc["gpu_pods"].update(count=2), "computed against other GPU pods (2 then, 1"),
    ],
    ids=["now", "windows", "mapping", "pods"],
)
def test_rows_that_do_not_fit_are_not_used_and_a_finding_says_why(
    tmp_path: Path, change: Any, reason: str
) -> None:
    _aggregated(tmp_path)
    from_raw = load_snapshot_dir(tmp_path, loaded())
    _edit(tmp_path, change)
    snapshot = load_snapshot_dir(tmp_path, loaded())
    unused = [f for f in snapshot.findings if f.kind == AGGREGATES_UNUSED]
    assert len(unused) == 1
    assert reason in unused[0].detail
    assert "telemetry from the raw history" in unused[0].detail
    assert snapshot.telemetry == from_raw.telemetry


def test_rows_that_do_not_fit_without_raw_history_leave_telemetry_unavailable(tmp_path: Path) -> None:
    _aggregated(tmp_path)
    (tmp_path / "m.om").unlink()
    _edit(tmp_path, lambda doc: doc.update(now="2026-11-29T11:00:00Z"))
    snapshot = load_snapshot_dir(tmp_path, loaded())
    assert AGGREGATES_UNUSED in kinds(snapshot.findings)
    assert not snapshot.telemetry.available
    assert "no DCGM series" in (snapshot.telemetry.problem or "")


def test_rows_are_not_used_without_a_snapshot_now(tmp_path: Path) -> None:
    _aggregated(tmp_path)
    (tmp_path / "snapshot.yaml").unlink()
    snapshot = load_snapshot_dir(tmp_path, loaded())
    (unused,) = [f for f in snapshot.findings if f.kind == AGGREGATES_UNUSED]
    assert "snapshot.yaml gives no `now`" in unused.detail


# --------------------------------------------------------------------------- malformed files


def _gpu(doc: dict[str, Any], window: int) -> dict[str, Any]:
    row: dict[str, Any] = doc["windows"][window]["gpus"][0]
    return row


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (
            lambda doc: doc["windows"][1]["gpus"][0].update(util_avg_percent="busy"),
            "windows[1].gpus[0].util_avg_percent",
            "valid number",
        ),
        (lambda doc: doc["windows"][0]["gpus"][0].pop("uuid"), "windows[0].gpus[0].uuid", "Field required"),
        (
            lambda doc: doc["windows"][0]["gpus"][0].update(extra=1),
            "windows[0].gpus[0].extra",
            "Extra inputs",
        ),
        (lambda doc: doc.update(now="2026-11-29T12:00:00"), "now", "timezone"),
        (lambda doc: doc.update(format="v0"), "format", "gpu-rebalancer/telemetry-windows/v1"),
        (
            lambda doc: doc["findings"].insert(0, {"kind": "leaked-vrma"}),
            "findings[0].kind",
            "unknown finding kind 'leaked-vrma' (did you mean 'leaked-vram'?)",
        ),
        (
            lambda doc: doc["windows"][0]["gpus"][0].update(fb_used_mib=-1),
            "windows[0].gpus[0].fb_used_mib",
            "greater than or equal to 0",
        ),
    ],
    ids=["type", "missing", "extra", "naive-now", "format", "unknown-finding-kind", "negative"],
)
def test_a_malformed_file_names_file_and_field(tmp_path: Path, change: Any, field: str, message: str) -> None:
    _aggregated(tmp_path)
    _edit(tmp_path, change)
    with pytest.raises(SnapshotError) as caught:
        load_snapshot_dir(tmp_path, loaded())
    (problem,) = caught.value.problems
    assert problem.startswith(f"{tmp_path / AGGREGATES_FILE}: {field}: ")
    assert message in problem


def test_a_malformed_file_is_a_clear_error_from_the_command_line(tmp_path: Path) -> None:
    copy = tmp_path / "demo"
    shutil.copytree(DEMO, copy)
    (copy / AGGREGATES_FILE).write_text('{"format": ', encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "rebalancer", "once", "--snapshot", str(copy), "--policy", str(DEMO_POLICY)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(f"rebalancer: error: {copy / AGGREGATES_FILE}: (top level): Invalid JSON")


def test_aggregate_refuses_a_directory_without_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "c.json", kube_list(node("n1")))
    write(tmp_path, "snapshot.yaml", "now: 2026-11-29T12:00:00Z\n")
    assert main(["aggregate", "--snapshot", str(tmp_path), "--policy", str(DEMO_POLICY)]) == 2
    assert "no telemetry to aggregate" in capsys.readouterr().err
    assert not (tmp_path / AGGREGATES_FILE).exists()


# --------------------------------------------------------------------------- the two readers

_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=3),
    st.sampled_from([0.0, -0.0, 1.5, -1.5, 100.0, 2**63, 1e308]),
    st.sampled_from(
        [
            "",
            "x",
            "2026-11-29T12:00:00Z",
            "2026-11-29T12:00:00.123456Z",
            "2026-11-29T12:00:00.1234567Z",
            "2026-11-29T12:00:00+01:00",
            "2026-11-29 12:00:00Z",
            "2026-11-29t12:00:00z",
            "2026-02-30T12:00:00Z",
            "2026-11-29T12:00:00",
            "a" * 64,
            "0" * 64 + "\n",
            "gpu-rebalancer/telemetry-windows/v1",
        ]
    ),
    st.just([]),
    st.just({}),
)


def _paths(doc: object, at: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Every place in the document, as the keys and indices that lead to it."""
    found: list[tuple[object, ...]] = [at] if at else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, (*at, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc[:2]):
            found += _paths(value, (*at, index))
    return found


@pytest.fixture(scope="module")
def aggregates_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("aggregates")
    _aggregated(root)
    doc: dict[str, Any] = json.loads((root / AGGREGATES_FILE).read_text(encoding="utf-8"))
    doc["findings"].append({"kind": "leaked-vram", "fb_used_mib": 3, "gpus": 1.5})
    return doc


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(data=st.data())
def test_the_fast_reader_takes_only_what_the_pydantic_reader_takes_alike(
    aggregates_doc: dict[str, Any], data: st.DataObject
) -> None:
    """msgspec reads the file fast; what it takes, the pydantic definition takes to the same rows (and
    what it refuses, the pydantic reader reads or names)."""
    doc = copy.deepcopy(aggregates_doc)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        *parents, last = data.draw(st.sampled_from(_paths(doc)))
        parent: Any = doc
        for step in parents:
            parent = parent[step]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            parent.pop(last, None)
        else:
            parent[last] = data.draw(_VALUES)
    raw = json.dumps(doc).encode()
    fast = _read_fast(raw)
    try:
        validated: object = _read_validated("f.json", raw)
    except InputError as exc:
        validated = exc
    if fast is not None:
        assert not isinstance(validated, InputError), validated.problems
        assert repr(fast) == repr(validated)


def test_the_fast_reader_reads_what_rebalancer_aggregate_writes(aggregates_doc: dict[str, Any]) -> None:
    raw = json.dumps(aggregates_doc).encode()
    fast = _read_fast(raw)
    assert fast is not None
    assert repr(fast) == repr(_read_validated("f.json", raw))


def test_the_fast_reader_s_rows_are_the_model_s_fields_in_its_order() -> None:
    """The fast reader makes each `GpuTelemetry` from a row's values by position: both name the same
    fields in the same order, and a field a row leaves out has the model's default."""
    model = msgspec.structs.fields(GpuTelemetry)
    assert _FastRow.__struct_fields__ == tuple(field.name for field in model)
    names, defaults = _FastRow.__struct_fields__, _FastRow.__struct_defaults__
    assert dict(zip(names[len(names) - len(defaults) :], defaults, strict=True)) == {
        field.name: field.default for field in model if field.default is not msgspec.NODEFAULT
    }


@pytest.mark.parametrize(
    "change",
    [
        lambda doc: doc["gpu_pods"].update(sha256="0" * 64 + "\n"),
        lambda doc: doc.update(now="2026-11-29 12:00:00Z"),
        lambda doc: doc.update(now="2026-11-29T12:00:00.1234567Z"),
        lambda doc: doc.update(now="2026-02-30T12:00:00Z"),
        lambda doc: doc["windows"][0]["gpus"][0].update(newest_sample="2026-11-29T12:00:00+01:00"),
        lambda doc: doc["windows"][0]["gpus"][0].update(util_samples=1.0),
        lambda doc: doc["windows"][0]["gpus"][0].update(util_avg_percent=7),
        lambda doc: doc["windows"][0]["gpus"][0].update(fb_free_mib=-0.0),
        lambda doc: doc["windows"][0]["gpus"][0].update(node=""),
        lambda doc: doc["windows"].append(doc["windows"][0]),
        lambda doc: doc["findings"].append({"kind": "x", "extra": 1}),
        lambda doc: doc["findings"].append({"kind": "leaked-vrma"}),
    ],
)
def test_the_readers_agree_on_the_edges(aggregates_doc: dict[str, Any], change: Any) -> None:
    doc = copy.deepcopy(aggregates_doc)
    change(doc)
    raw = json.dumps(doc).encode()
    fast = _read_fast(raw)
    try:
        validated: object = _read_validated("f.json", raw)
    except InputError:
        assert fast is None
        return
    assert fast is None or repr(fast) == repr(validated)
