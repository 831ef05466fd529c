"""Stub answers to the live telemetry source's queries, chosen by what each query asks, not its text.

`vector(samples)` is an instant-vector answer as Prometheus writes it (the `StubPrometheus` default).

`plan_responder(table)` is a `StubPrometheus` responder: a query of the source's plan
(`sources.prometheus_plan.query_plan` for the given config and windows) is answered with the samples
`table` gives for its (aggregate, metric), or for its (aggregate, metric, window) when the table holds
that; anything else (another query, the late query) gets an empty instant vector. Aggregates are the
plan's: `ts` (newest sample time within the lookback), `last` (newest value), `count`, `sum`, `max`,
`series`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar, cast

from rebalancer.policy import TelemetryConfig
from rebalancer.sources.prometheus_plan import query_plan
from tests.builders import NOW

Answer = tuple[int, bytes]
Samples = Sequence[tuple[Mapping[str, str], float]]
# A table's key: (aggregate, metric), or (aggregate, metric, window).
PlanKey = tuple[str, str] | tuple[str, str, int]
_Key = TypeVar("_Key", bound=PlanKey)
UTIL, USED, FREE = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"


def _text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def vector(samples: Samples, at: float | None = None) -> Answer:
    """A 200 instant-vector answer at `at` (NOW), NaN and infinities written the way Prometheus writes
    them."""
    when = NOW.timestamp() if at is None else at
    result = [{"metric": dict(labels), "value": [when, _text(v)]} for labels, v in samples]
    return 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def plan_responder(
    table: Mapping[_Key, Samples],
    cfg: TelemetryConfig | None = None,
    windows: Iterable[int] = (1800,),
) -> Callable[[dict[str, str]], Answer]:
    """Answers each query of the plan with the table's samples for what it asks (see the module)."""
    plan = {q.expr: q for q in query_plan(cfg or TelemetryConfig(), windows)}
    # Only read: a table of either kind of key is looked up by both.
    lookup = cast(Mapping[PlanKey, Samples], table)

    def respond(params: dict[str, str]) -> Answer:
        query = plan.get(params.get("query", ""))
        if query is None:
            return vector([])
        if query.window is not None and (query.aggregate, query.metric, query.window) in lookup:
            return vector(lookup[(query.aggregate, query.metric, query.window)])
        return vector(lookup.get((query.aggregate, query.metric), []))

    return respond
