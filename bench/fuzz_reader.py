#!/usr/bin/env python3
"""Fuzz the exposition reader against prometheus_client's parsers with many more cases than the tests.

    .venv/bin/python bench/fuzz_reader.py [--cases 20000] [--seed S]

Draws expositions from the strategies of tests/fuzzing/exposition_texts.py (`exposition_texts`: from
scratch, tame or wild; `mutated_expositions`: the base snapshot's expositions mutated), half each, and
compares, as tests/test_exposition_reader.py does, the fast reading with prometheus_client's (the same
series and samples or the same error at the same line; where ours accepts, the library's parser on the
whole text gives the same samples), in the drawn format and the other one, cut into documents of 1, 2,
3 or 20,000 samples, with and without a metric filter. Prints how many cases ran, how many documents
the fast reading read or left to the library, and the first differences; exits 1 when any case differed.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rebalancer.telemetry.exposition import DOCUMENT_SAMPLES, ExpositionError  # noqa: E402
from rebalancer.telemetry.exposition_documents import documents  # noqa: E402
from tests import fuzzing  # noqa: E402
from tests.exposition_differential import difference, lines_of  # noqa: E402

METRICS = (None, ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"), ("a", "a_total"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--cases", type=int, default=20_000, help="cases in total (half from each strategy)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (same seed, same cases)")
    parser.add_argument("--show", type=int, default=5, help="differences printed")
    args = parser.parse_args(argv)

    counts = {"cases": 0, "read": 0, "library": 0}
    differences: list[str] = []
    start, cpu = time.perf_counter(), time.process_time()
    for strategy in (fuzzing.exposition_texts(), fuzzing.mutated_expositions()):

        @seed(args.seed)
        @settings(
            max_examples=args.cases // 2,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(drawn=strategy, data=st.data())
        def one(drawn: tuple[str, bool], data: st.DataObject) -> None:
            text, openmetrics = drawn
            counts["cases"] += 1
            fmt = data.draw(st.sampled_from((openmetrics, openmetrics, not openmetrics)))
            size = data.draw(st.sampled_from((1, 2, 3, DOCUMENT_SAMPLES)))
            metrics = data.draw(st.sampled_from(METRICS))
            with contextlib.suppress(ExpositionError):
                for document in documents(lines_of(text), openmetrics=fmt, samples=size, source="x"):
                    counts["read" if document.read is not None else "library"] += 1
            found = difference(text, openmetrics=fmt, metrics=metrics, document_samples=size)
            if found is not None:
                differences.append(
                    f"{text!r}\nopenmetrics={fmt}, documents of {size}, metrics={metrics}\n{found}"
                )

        one()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        f"{counts['cases']:,} cases, {counts['read']:,} documents read fast, {counts['library']:,} left to "
        f"prometheus_client; {len(differences)} differed; {time.perf_counter() - start:.0f} s wall, "
        f"{time.process_time() - cpu:.0f} s CPU, {usage.ru_maxrss / 1024:.0f} MiB"
    )
    for shown in differences[: args.show]:
        print("\n" + shown)
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
