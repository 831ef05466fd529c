"""kubectl habits of the command line: `-o`, `version`, `--exit-code`, defaults in every option's help,
`strategies -o yaml` as a pasteable policy fragment, and text rows that fit the terminal."""

from __future__ import annotations

import argparse
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rebalancer.cli import EXIT_WOULD_ACT, build_parser, main
from rebalancer.cycle import run_cycle
from rebalancer.evictor import DryRunEvictor
from rebalancer.policy import loads_policy
from rebalancer.registry import all_strategies
from rebalancer.report import render
from rebalancer.sources.files import load_snapshot_dir

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "demo-cluster"
DEMO_ARGS = ["--snapshot", str(DEMO), "--policy", str(DEMO / "policy.yaml")]


def commands() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    yield from sub.choices.items()


def options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    yield from (a for a in parser._actions if a.option_strings and a.default is not argparse.SUPPRESS)


def test_every_option_of_every_command_has_help_and_shows_its_default() -> None:
    missing, no_default = [], []
    for name, parser in commands():
        formatter = parser._get_formatter()
        for action in options(parser):
            if not action.help:
                missing.append(f"{name} {action.option_strings[0]}")
            shown = formatter._get_help_string(action) or ""
            if action.nargs != 0 and action.default not in (None, False) and "default" not in shown:
                no_default.append(f"{name} {action.option_strings[0]}")
    assert missing == []
    assert no_default == []


def test_help_shows_a_default_the_option_did_not_spell_out(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--scheduler {packed,spread} scheduler model: packed = MostAllocated on GPUs" in help_text
    assert "LeastAllocated (default: packed)" in help_text


@pytest.mark.parametrize("command", ["once", "simulate", "waste", "strategies"])
def test_o_is_output_wherever_output_is(command: str) -> None:
    parser = dict(commands())[command]
    (output,) = [a for a in parser._actions if "--output" in a.option_strings]
    assert output.option_strings == ["-o", "--output"]


def test_once_o_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["once", *DEMO_ARGS, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "dry-run"


def test_version_is_pyprojects(capsys: pytest.CaptureFixture[str]) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert main(["version"]) == 0
    assert capsys.readouterr().out == f"gpu-rebalancer {version}\n"
    # `--version` too, on standard output as argparse's own action prints it, and exiting 0.
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr() == (f"gpu-rebalancer {version}\n", "")


def test_exit_code_fails_ci_when_the_dry_run_would_act(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["once", *DEMO_ARGS, "--exit-code"]) == EXIT_WOULD_ACT == 3
    assert main(["once", *DEMO_ARGS]) == 0  # without the flag: success whatever it would do
    # A policy whose strategies find nothing to do: exit 0 with the flag too.
    quiet = tmp_path / "quiet.yaml"
    quiet.write_text(
        "strategies:\n- name: gpu-consolidation\n  args: {max_allocated_percent: 0, "
        "drain_onto_larger_nodes: false, max_utilization_percent: null}\ntelemetry: null\n"
    )
    assert main(["once", "--snapshot", str(DEMO), "--policy", str(quiet), "--exit-code"]) == 0
    assert "No evictions proposed." in capsys.readouterr().out


# --------------------------------------------------------------------------- strategies -o yaml


def test_strategies_yaml_loads_as_a_policy_with_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["strategies", "-o", "yaml"]) == 0
    text = capsys.readouterr().out
    loaded = loads_policy(text, "strategies.yaml")
    specs = all_strategies()
    assert [s.name for s in loaded.strategies] == list(specs)
    for configured in loaded.strategies:
        assert configured.args == specs[configured.name].args_model()


def test_strategies_yaml_spells_values_as_a_policy_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["strategies", "-o", "yaml"]) == 0
    text = capsys.readouterr().out
    (consolidation,) = [s for s in yaml.safe_load(text)["strategies"] if s["name"] == "gpu-consolidation"]
    assert consolidation["args"]["window"] == "1h"
    assert consolidation["args"]["max_telemetry_age"] == "5m"
    assert consolidation["args"]["packed_schedulers"] == ["gpu-packed-scheduler"]
    # Each argument's description is the comment above it.
    lines = text.splitlines()
    at = lines.index("      min_node_age: 10m")
    assert lines[at - 1].startswith("      # Nodes younger than this")
    assert "('gpu-packed-scheduler',)" not in text and "3600" not in text


def test_every_strategy_argument_has_a_description() -> None:
    undescribed = [
        f"{name}.{field}"
        for name, spec in all_strategies().items()
        for field, info in spec.args_model.model_fields.items()
        if not info.description
    ]
    assert undescribed == []


def test_strategies_text_spells_defaults_as_a_policy_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["strategies"]) == 0
    out = capsys.readouterr().out
    assert "    packed_schedulers (default [gpu-packed-scheduler]): Only pods placed by" in out
    assert "    window (default 1h): " in out


# --------------------------------------------------------------------------- terminal width


def demo_report_text(width: int | None) -> str:
    from rebalancer.policy import load_policy

    loaded = load_policy(DEMO / "policy.yaml")
    return render(run_cycle(load_snapshot_dir(DEMO, loaded), loaded, DryRunEvictor()), "text", width)


def decision_lines(text: str) -> list[str]:
    return text.split("\n\n")[1].splitlines()


def test_text_rows_fit_the_terminal_with_the_reason_wrapped_under_them() -> None:
    wide, narrow = demo_report_text(None), demo_report_text(100)
    assert max(len(line) for line in decision_lines(wide)) > 100
    rows = decision_lines(narrow)
    assert max(len(line) for line in rows) <= 100
    assert rows[0].split() == ["STRATEGY", "POD", "NODE", "VERDICT", "TARGET"]
    # Every reason is there, under its row, indented.
    under = " ".join(line.strip() for line in rows if line.startswith("    "))
    for line in decision_lines(wide)[1:]:
        reason = line.split("  ")[-1].strip()
        assert " ".join(reason.split()) in under


def test_once_wraps_at_columns(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    assert main(["once", *DEMO_ARGS]) == 0
    assert max(len(line) for line in decision_lines(capsys.readouterr().out)) <= 120


# --------------------------------------------------------------------------- -n / -A


@pytest.mark.parametrize("command", ["once", "explain", "run"])
def test_n_and_a_scope_the_pods_listed_live(command: str) -> None:
    subject = ["gpu-a-1"] if command == "explain" else []
    parse = build_parser().parse_args
    assert parse([command, *subject, "-n", "ml", "-n", "notebooks"]).namespaces == ["ml", "notebooks"]
    every = parse([command, *subject, "-A"])
    assert (every.namespaces, every.all_namespaces) == (None, True)


def test_n_and_a_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["once", "-n", "ml", "-A"])
    assert exited.value.code == 2
    assert "not allowed with argument -n/--namespace" in capsys.readouterr().err


def test_restore_takes_n_or_a() -> None:
    parse = build_parser().parse_args
    assert parse(["restore", "--all-reclaimed", "-n", "ml"]).namespace == "ml"
    assert parse(["restore", "--all-reclaimed", "-A"]).namespace is None
    with pytest.raises(SystemExit):
        parse(["restore", "--all-reclaimed", "-n", "ml", "-A"])


def test_a_snapshot_refuses_n_it_could_not_honour(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["once", *DEMO_ARGS, "-n", "ml"]) == 2
    assert "once --snapshot: --namespace: only restricts the pods listed" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--state-file", "--state-namespace"])
def test_a_snapshot_refuses_the_memory_of_a_live_run(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["once", *DEMO_ARGS, flag, "x"]) == 2
    assert f"once --snapshot: {flag}: only keeps a live run's memory" in capsys.readouterr().err
