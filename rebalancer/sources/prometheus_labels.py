"""The label sets of Prometheus' answers: each decoded and identified once, known by a small integer id.

Owns `LabelSets`, what `sources.prometheus` reads the label sets of a telemetry read's answers with:

- a label set is known by an id (`keys[id]`: its labels, sorted, without `__name__`), so that every
  later join of the read (`prometheus_rows.Rows`) is on an integer;
- Prometheus writes a label set the same way in every answer, and lists an aggregation's label sets in
  the same order in every answer of the plan (its series are selected in label order, and grouped in
  the order they come), so an answer whose label sets are those of the last answer costs one list
  comparison in C, and any other answer one dictionary lookup of each series' raw bytes; only a label
  set never seen is decoded;
- its identity (`telemetry.identity.identify`: node, UUID, MIG instance, pod labels) is resolved once,
  per label mapping; attributing it to a pod of the cluster stays the read's (pods come and go);
- kept across reads (the daemon keeps one for all its cycles, `daemon.wiring`), so a GPU's label set is
  decoded and identified once while its series live, not every cycle: 42,243 label sets at 5,000 nodes,
  38 MiB kept between cycles (a (name, value) pair is held once: a node's GPUs share its name, model
  and namespace labels; the last answer is let go when a read ends). Bounded: a read that starts while
  the sets outnumber twice those the last read saw (plus `SLACK`) starts afresh, so label sets of
  deleted pods do not pile up.

It must not do I/O or read the clock. Not thread-safe: one read at a time (the daemon's cycles are).
"""

from __future__ import annotations

import msgspec

from rebalancer.policy import LabelMapping
from rebalancer.sources.prometheus_http import PrometheusError, VectorSample
from rebalancer.sources.prometheus_rows import LabelKey, Vector
from rebalancer.telemetry.identity import SeriesIdentity, identify

__all__ = ["SLACK", "LabelSets"]

# Label sets kept beyond twice those of the last read before a read starts afresh.
SLACK = 1024


class LabelSets:
    """Label sets of answers, each decoded once and known by a small integer id (`keys[id]`)."""

    def __init__(self) -> None:
        self._mapping: LabelMapping | None = None
        self._seen_before = 0
        self._start_afresh()

    def _start_afresh(self) -> None:
        self._ids: dict[bytes, int] = {}
        # Each (name, value) pair held once.
        self._pairs: dict[tuple[str, str], tuple[str, str]] = {}
        self._by_key: dict[LabelKey, int] = {}
        self.keys: list[LabelKey] = []
        self._identities: dict[int, SeriesIdentity | None] = {}
        self._last: list[msgspec.Raw] = []  # the label sets of the last answer read, in its order
        self._last_ids: list[int] = []
        self._seen: set[int] = set()  # the ids this read has answered

    def begin(self, mapping: LabelMapping) -> None:
        """A read starts, its series identified by `mapping`: start afresh if the label sets outgrew
        the last read's, and forget the identities if the mapping changed."""
        seen = len(self._seen) or self._seen_before
        if len(self.keys) > 2 * seen + SLACK:
            self._start_afresh()
        self._seen_before, self._seen = seen, set()
        if mapping != self._mapping:
            self._identities = {}
            self._mapping = mapping

    def close(self) -> None:
        """A read ended (`contextlib.closing`): let go of its last answer, whose label sets hold that
        answer's body (8.5 MiB at 5,000 nodes)."""
        self._last, self._last_ids = [], []

    def __len__(self) -> int:
        return len(self.keys)

    def id(self, raw: msgspec.Raw) -> int:
        """The id of the label set written `raw` (a JSON object of strings). Raises PrometheusError."""
        text = bytes(raw)
        found = self._ids.get(text)
        if found is None:
            try:
                labels = msgspec.json.decode(text, type=dict[str, str])
            except msgspec.DecodeError:
                raise PrometheusError(f"malformed series labels: {text[:200]!r}") from None
            pairs = self._pairs
            key = tuple(sorted(pairs.setdefault(kv, kv) for kv in labels.items() if kv[0] != "__name__"))
            found = self._ids[text] = self.id_of(key)  # marks it seen
        else:
            self._seen.add(found)
        return found

    def id_of(self, key: LabelKey) -> int:
        """The id of the label set `key` (sorted, without `__name__`)."""
        found = self._by_key.get(key)
        if found is None:
            found = self._by_key[key] = len(self.keys)
            self.keys.append(key)
        self._seen.add(found)
        return found

    def vector(self, samples: list[VectorSample]) -> Vector:
        """An answer as label set id -> value. Raises PrometheusError on malformed labels."""
        metrics = [sample.metric for sample in samples]
        values = [sample.value[1] for sample in samples]
        if metrics == self._last:  # the same label sets in the same order: the last answer's ids
            ids = self._last_ids
        else:
            known = self._ids
            ids = [found if (found := known.get(bytes(raw))) is not None else self.id(raw) for raw in metrics]
            self._last, self._last_ids = metrics, ids
        self._seen.update(ids)
        return dict(zip(ids, values, strict=True))

    def identity(self, key: int) -> SeriesIdentity | None:
        """The identity of label set `key` under the mapping `begin` was given (None: unusable, no node
        or no UUID), not attributed to any pod."""
        try:
            return self._identities[key]
        except KeyError:
            if self._mapping is None:
                raise AssertionError("LabelSets.identity before begin()") from None
            found = self._identities[key] = identify(dict(self.keys[key]), self._mapping)
            return found
