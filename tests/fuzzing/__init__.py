"""Fuzzing the command line's input contract.

The contract (README, "Commands"): for every input, `rebalancer once --snapshot DIR [--policy FILE]`
and `rebalancer validate POLICY...` exit 0, or exit 2 with one line per problem on stderr, each of
the form `rebalancer: error: <where>: <what>` where <where> names the file (and the line or field
where known). Never a traceback, never exit 1 for a problem in a file, always in bounded time and
memory.

This package holds everything the fuzz tests (tests/test_fuzz.py, tests/test_exposition_reader.py) and
the long runners (bench/fuzz.py, bench/fuzz_reader.py) share, a module a concern, lowest first:

- `layout`: the paths of the inputs, the layout of a case directory, the names and limits every part
  shares;
- `case`: `Case`, the files of one input (a snapshot directory `snapshot/`, policies next to it) and the
  command to run on them; the base case, the command line, writing a case out;
- hypothesis strategies that mutate the real inputs of `tests/fixtures/fuzz/base` (a small cut of
  examples/demo-cluster) and the shipped policies:
  - `values`: the nasty values and the raw fragments a serialiser cannot write;
  - `edits`: structure-aware edits (parse the JSON / YAML, change one path, write it back);
  - `object_fields` and `objects`: kubectl objects and Lists (the fields the rebalancer reads; the
    object files of the snapshot, in JSON or YAML);
  - `files`: byte-level damage, and whole files (compressed, moved, renamed, deleted);
  - `expositions`: DCGM expositions; `exposition_texts`: whole expositions for the differential test of
    the exposition reader;
  - `snapshot_yaml`: `snapshot.yaml`; `policies`: policies;
  - `kinds`: the input kinds and `cases(kind)`, the strategy tests/test_fuzz.py and bench/fuzz.py draw
    cases from;
- `runner`: `run_case` runs the command on a case in a forked child under an address-space limit and a
  time limit, and collects its exit status, output and resource use;
- `contract`: `violations`, what in a result breaks the contract, and `signature`, a short key that
  groups the results of one bug;
- `reducer`: `minimize`, a delta-debugging reducer that keeps a failing case small while its signature
  holds;
- `corpus`: `save_case` writes a failing case under `tests/fuzz_corpus/<hash>/` (its files plus a
  `case.json`), `load_corpus` reads every saved case back.

A module imports only modules listed before it (`layout` none of the package), never the package.
This file holds no code: it re-exports the names the tests and bench/ use, so that they import
`tests.fuzzing` alone.
"""

from __future__ import annotations

from tests.fuzzing.case import BASE_FILES, POLICY_TEXTS, Case, base_case
from tests.fuzzing.contract import VIOLATION_ORDER, _cut, describe, signature, violations
from tests.fuzzing.corpus import CorpusEntry, load_corpus, save_case
from tests.fuzzing.exposition_texts import exposition_texts, mutated_expositions
from tests.fuzzing.kinds import KINDS, Kind, cases
from tests.fuzzing.layout import CHILD_CRASH, DEFAULT_TIMEOUT, GIB, STRATEGY_NAMES
from tests.fuzzing.reducer import minimize
from tests.fuzzing.runner import run, run_case, warm_up

# The names bench/ and the tests use as `fuzzing.X` (bench/fuzz.py also borrows `_cut`).
__all__ = [
    "BASE_FILES",
    "CHILD_CRASH",
    "DEFAULT_TIMEOUT",
    "GIB",
    "KINDS",
    "POLICY_TEXTS",
    "STRATEGY_NAMES",
    "VIOLATION_ORDER",
    "Case",
    "CorpusEntry",
    "Kind",
    "_cut",
    "base_case",
    "cases",
    "describe",
    "exposition_texts",
    "load_corpus",
    "minimize",
    "mutated_expositions",
    "run",
    "run_case",
    "save_case",
    "signature",
    "violations",
    "warm_up",
]
