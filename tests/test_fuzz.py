"""The command line's input contract under fuzzing (the package tests/fuzzing/ holds the harness).

For every input, `rebalancer once --snapshot DIR [--policy FILE]` and `rebalancer validate POLICY...`
exit 0, or exit 2 with one `rebalancer: error: <where>: <what>` line per problem naming the file:
never a traceback, never exit 1 for a problem in a file, in bounded time and memory.

- `test_mutated_inputs_keep_the_contract`: a few hundred hypothesis examples over every input kind,
  derandomised (the same examples on every run) and without shrinking (a failure is reported as drawn,
  with its description, at the price of one run);
- `test_corpus_case_keeps_the_contract`: every case saved under tests/fuzz_corpus (by
  `python bench/fuzz.py --save-failures`), replayed;
- the harness tests: the contract checks do catch a raising, crashing, hanging, memory-hungry or
  badly-worded command, so that the fuzz tests cannot pass vacuously.

Each case runs in a forked child; a case takes well under a tenth of a second on the base snapshot.
The time limit here is 5 s a case, far above any legitimate run, so that a hang costs little.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests import fuzzing
from tests.fuzzing import Case, Kind

TIMEOUT = 5.0
EXAMPLES_PER_KIND = 40

FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES_PER_KIND,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=False,
)


def check(case: Case, *, timeout: float = TIMEOUT) -> None:
    result = fuzzing.run(case, timeout=timeout)
    found = fuzzing.violations(result)
    assert not found, fuzzing.describe(case, result, found)


# --------------------------------------------------------------------------- fuzzing


@pytest.mark.parametrize("kind", fuzzing.KINDS)
@FUZZ_SETTINGS
@given(data=st.data())
def test_mutated_inputs_keep_the_contract(kind: Kind, data: st.DataObject) -> None:
    case = data.draw(fuzzing.cases(kind), label="case")
    check(case)


def _corpus_entries() -> list[fuzzing.CorpusEntry]:
    # The base case first: the parameter list is never empty, even before anything was saved.
    base = fuzzing.CorpusEntry("base", fuzzing.base_case(), {"signature": "", "note": "the base snapshot"})
    return [base, *fuzzing.load_corpus()]


@pytest.mark.parametrize("entry", _corpus_entries(), ids=lambda entry: entry.name)
def test_corpus_case_keeps_the_contract(entry: fuzzing.CorpusEntry) -> None:
    result = fuzzing.run(entry.case, timeout=TIMEOUT)
    found = fuzzing.violations(result)
    recorded = entry.recorded.get("signature") or "nothing"
    assert not found, f"first seen as: {recorded}\n" + fuzzing.describe(entry.case, result, found)


# --------------------------------------------------------------------------- the base input


def test_base_snapshot_runs_clean_and_exercises_every_strategy() -> None:
    result = fuzzing.run(fuzzing.base_case("once-json"), timeout=TIMEOUT)
    assert fuzzing.violations(result) == []
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    strategies = {row["strategy"] for row in report["decisions"]}
    assert strategies == set(fuzzing.STRATEGY_NAMES)
    assert {row["outcome"] for row in report["decisions"]} >= {"would-evict"}
    assert "leaked-vram" in {finding["kind"] for finding in report["findings"]}
    assert report["summary"]["nodes"] == 6
    assert report["summary"]["pods"] == 16


def test_base_policies_validate() -> None:
    case = fuzzing.base_case("validate").with_file(
        "policy-2.yaml", fuzzing.POLICY_TEXTS["policies/default.yaml"], ""
    )
    result = fuzzing.run(case, timeout=TIMEOUT)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["policy-2.yaml: valid", "policy.yaml: valid"]


def test_base_snapshot_is_small() -> None:
    assert fuzzing.base_case().size < 200 * 1024
    assert {name.split("/")[-1] for name in fuzzing.BASE_FILES} == {
        "nodes.json",
        "pods.json",
        "extra.yaml",
        "dcgm.om",
        "metrics.prom",
        "snapshot.yaml",
        "workloads.json",
    }


@pytest.mark.parametrize("kind", fuzzing.KINDS)
def test_every_kind_changes_the_input(kind: Kind) -> None:
    """The strategies are not vacuous: each kind finds cases that differ from the base input."""
    from hypothesis import find

    base = fuzzing.base_case()
    changed = find(
        fuzzing.cases(kind),
        lambda case: case.files != base.files,
        settings=settings(database=None, derandomize=True, max_examples=50, phases=[Phase.generate]),
    )
    assert changed.note


# --------------------------------------------------------------------------- the harness catches violations


def _raises(argv: Sequence[str]) -> int:
    raise KeyError("boom")


def test_an_escaping_exception_is_a_violation() -> None:
    result = fuzzing.run_case(fuzzing.base_case().files, "once", main=_raises, timeout=TIMEOUT)
    found = fuzzing.violations(result)
    assert result.exit_code == fuzzing.CHILD_CRASH
    assert any(v.startswith("traceback: KeyError: 'boom'") for v in found), found
    assert fuzzing.signature(found).startswith("traceback: KeyError")


def _exit_1(argv: Sequence[str]) -> int:
    print(f"rebalancer: error: {argv[2]}: something", file=sys.stderr)
    return 1


def test_exit_1_is_a_violation() -> None:
    result = fuzzing.run_case(fuzzing.base_case().files, "once", main=_exit_1, timeout=TIMEOUT)
    assert [v.split(":")[0] for v in fuzzing.violations(result)] == ["exit-code"]


def _unlocated(argv: Sequence[str]) -> int:
    print("rebalancer: error: Pod ml/x: spec: expected an object", file=sys.stderr)
    print("  a continuation line", file=sys.stderr)
    return 2


def test_unlocated_and_unprefixed_lines_are_violations() -> None:
    result = fuzzing.run_case(fuzzing.base_case().files, "once", main=_unlocated, timeout=TIMEOUT)
    kinds = [v.split(":")[0] for v in fuzzing.violations(result)]
    assert kinds == ["unlocated-line", "unprefixed-line"]


def _located(argv: Sequence[str]) -> int:
    print("rebalancer: error: snapshot/pods.json:3:1: invalid JSON: Expecting value", file=sys.stderr)
    print("rebalancer: error: snapshot/extra.yaml (document 2) items[0]: Pod a/b: bad", file=sys.stderr)
    print("rebalancer: error: snapshot: no `now` for this snapshot: add snapshot.yaml", file=sys.stderr)
    print("rebalancer: error: policy.yaml:4: strategies[0].name: unknown strategy", file=sys.stderr)
    return 2


def test_located_messages_hold() -> None:
    result = fuzzing.run_case(fuzzing.base_case().files, "once", main=_located, timeout=TIMEOUT)
    assert fuzzing.violations(result) == []


def _long_line(argv: Sequence[str]) -> int:
    print(f"rebalancer: error: {argv[2]}/pods.json: value {'x' * 5000}", file=sys.stderr)
    return 2


def test_an_overlong_line_is_a_violation() -> None:
    result = fuzzing.run_case(fuzzing.base_case().files, "once", main=_long_line, timeout=TIMEOUT)
    assert [v.split(":")[0] for v in fuzzing.violations(result)] == ["overlong-line"]


def _silent_2(argv: Sequence[str]) -> int:
    return 2


def test_exit_2_without_a_message_is_a_violation() -> None:
    result = fuzzing.run_case(fuzzing.base_case().files, "once", main=_silent_2, timeout=TIMEOUT)
    assert [v.split(":")[0] for v in fuzzing.violations(result)] == ["empty-stderr"]


def _hangs(argv: Sequence[str]) -> int:
    while True:
        time.sleep(0.05)


def test_a_hang_is_a_violation() -> None:
    started = time.monotonic()
    result = fuzzing.run_case(fuzzing.base_case().files, "once", main=_hangs, timeout=1.0)
    assert result.timed_out
    assert time.monotonic() - started < 8
    found = fuzzing.violations(result)
    assert found[0].startswith("timeout:"), found
    assert "_hangs" in result.stderr  # where it was stuck, for the report


def _eats_memory(argv: Sequence[str]) -> int:
    hoard = bytearray(4 * fuzzing.GIB)  # beyond the address-space limit: refused at once
    return len(hoard)


def test_running_out_of_memory_is_a_violation() -> None:
    result = fuzzing.run_case(fuzzing.base_case().files, "once", main=_eats_memory, timeout=TIMEOUT)
    found = fuzzing.violations(result)
    assert any(v.startswith("memory: MemoryError") for v in found), found


def _crashes(argv: Sequence[str]) -> int:
    os.kill(os.getpid(), signal.SIGSEGV)
    return 0


def test_a_crash_is_a_violation() -> None:
    result = fuzzing.run_case(fuzzing.base_case().files, "once", main=_crashes, timeout=TIMEOUT)
    assert result.signal == signal.SIGSEGV
    assert fuzzing.violations(result)[0].startswith("signal: killed by SIGSEGV")


def _nan_report(argv: Sequence[str]) -> int:
    print('{"summary": {"estimated_savings_per_hour": NaN}}')
    return 0


def test_a_non_standard_json_report_is_a_violation() -> None:
    result = fuzzing.run_case(fuzzing.base_case().files, "once-json", main=_nan_report, timeout=TIMEOUT)
    assert [v.split(":")[0] for v in fuzzing.violations(result)] == ["invalid-json-report"]


def test_the_child_sees_the_case_and_only_it() -> None:
    seen: list[str] = []

    def lists(argv: Sequence[str]) -> int:
        seen.extend(sorted(os.listdir(argv[2])))
        print(" ".join(seen))
        return 0

    result = fuzzing.run_case(fuzzing.base_case().files, "once", main=lists, timeout=TIMEOUT)
    assert result.stdout.split() == sorted(name.split("/")[-1] for name in fuzzing.BASE_FILES)
    assert seen == []  # the child's memory is its own


# --------------------------------------------------------------------------- corpus and signatures


def test_corpus_round_trip(tmp_path: Path) -> None:
    case = Case(
        {"snapshot/pods.json": b"{", "snapshot/sub/": b"", "policy.yaml": b"dry_run: maybe\n"},
        "once-json",
        "a note",
    )
    found = ["traceback: ValueError: bad at rebalancer/x.py:3 in f"]
    saved = fuzzing.save_case(case, found, tmp_path)
    entries = fuzzing.load_corpus(tmp_path)
    assert [e.name for e in entries] == [saved.name]
    assert entries[0].case.files == case.files
    assert entries[0].case.argv_kind == "once-json"
    assert entries[0].recorded["signature"] == fuzzing.signature(found)


def test_signatures_group_one_bug() -> None:
    one = [
        "exit-code: exit 99",
        "traceback: KeyError: 'spec' at rebalancer/sources/kube_objects.py:120 in _pod",
    ]
    two = ["traceback: KeyError: 'status' at rebalancer/sources/kube_objects.py:131 in _pod"]
    other = ["traceback: KeyError: 'spec' at rebalancer/sources/files.py:120 in _objects"]
    assert fuzzing.signature(one) == fuzzing.signature(two)
    assert fuzzing.signature(one) != fuzzing.signature(other)
    assert fuzzing.signature(["unlocated-line: x", "timeout: no exit"]).startswith("timeout")


def test_minimize_keeps_the_signature_and_shrinks() -> None:
    big = fuzzing.base_case().with_file("snapshot/bad.json", b"{", "")

    def keeps(candidate: Case) -> bool:
        return "snapshot/bad.json" in candidate.files and candidate.files["snapshot/bad.json"].startswith(
            b"{"
        )

    small = fuzzing.minimize(big, keeps, budget=40)
    assert keeps(small)
    assert small.size < big.size // 10


def test_minimize_cuts_long_repetitions_keeping_brackets_matched() -> None:
    deep = Case({"snapshot/pods.json": b"[" * 40_000 + b"]" * 40_000}, "once")

    def keeps(candidate: Case) -> bool:
        data = candidate.files.get("snapshot/pods.json", b"")
        return data.count(b"[") == data.count(b"]") >= 2_000

    small = fuzzing.minimize(deep, keeps, budget=40)
    assert keeps(small)
    assert small.size < 10_000


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.data())
def test_every_edit_of_a_string_of_non_decimal_digits_is_drawn(data: st.DataObject) -> None:
    # `"²".isdigit()` is true, but int() refuses it: a drawn edit must never crash the harness itself.
    from tests.fuzzing.edits import edit_document
    from tests.fuzzing.values import _Raw

    data.draw(edit_document(["²", {"n": "③"}], _Raw()))
