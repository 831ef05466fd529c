"""Where the fuzzer's inputs live, and the names and limits every part of tests/fuzzing/ shares.

Owns the paths (the base snapshot `tests/fixtures/fuzz/base`, the corpus `tests/fuzz_corpus/`, the seed
policies), the layout of a case directory (`snapshot/`, `policy.yaml`, `case.json`), what the contract's
messages start with, the time and memory limits of a run, the command kinds (`ArgvKind`) and the types
of decoded documents (`Json`, `JsonPath`).

This module must hold constants only and import nothing of the harness: every other module imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

# --------------------------------------------------------------------------- layout

ROOT = Path(__file__).resolve().parents[2]
BASE_DIR = ROOT / "tests" / "fixtures" / "fuzz" / "base"
CORPUS_DIR = ROOT / "tests" / "fuzz_corpus"
DEMO_POLICY = ROOT / "examples" / "demo-cluster" / "policy.yaml"
POLICY_SEEDS = (
    DEMO_POLICY,
    ROOT / "policies" / "default.yaml",
    *sorted((ROOT / "policies" / "examples").glob("*.yaml")),
)

SNAPSHOT_DIR = "snapshot"
POLICY_FILE = "policy.yaml"
CASE_FILE = "case.json"
ERROR_PREFIX = "rebalancer: error: "
WARNING_PREFIX = "rebalancer: warning: "
MAX_LINE = 2000  # longest acceptable stderr line: values echoed in messages must be cut
STRATEGY_NAMES = ("gpu-affinity", "idle-gpu", "topology-spread", "gpu-consolidation")

GIB = 1024**3
DEFAULT_TIMEOUT = 20.0
DEFAULT_MEMORY = 2 * GIB
CHILD_CRASH = 99  # exit code of a child whose command raised

ArgvKind = Literal["once", "once-json", "once-markdown", "validate"]
ARGV_KINDS: tuple[ArgvKind, ...] = ("once", "once-json", "once-markdown", "validate")
ONCE_KINDS: tuple[ArgvKind, ...] = ("once", "once-json", "once-markdown")

# Decoded JSON / YAML: anything a loader can return.
Json = Any
JsonPath = tuple[str | int, ...]
