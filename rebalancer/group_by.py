"""How `rebalancer waste` groups its rows: by namespace, by workload, or by the values of one pod label.

Owns `GroupBy` and its spelling on the command line (`namespace`, `workload`, `label:KEY`); standard
library only, so the command line can read the flag without loading the counting. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["GroupBy"]


@dataclass(frozen=True, slots=True)
class GroupBy:
    """What the table's rows are: namespaces, workloads, or the values of one pod label."""

    kind: Literal["namespace", "workload", "label"]
    label: str | None = None

    @classmethod
    def parse(cls, text: str) -> GroupBy:
        """`namespace`, `workload` or `label:KEY`; ValueError otherwise."""
        if text == "namespace":
            return cls(kind="namespace")
        if text == "workload":
            return cls(kind="workload")
        key = text.removeprefix("label:")
        if text.startswith("label:") and key.strip() == key and key:
            return cls(kind="label", label=key)
        raise ValueError(f"expected namespace, workload or label:KEY, got {text!r}")

    @property
    def needs_cluster(self) -> bool:
        return self.kind != "namespace"

    def __str__(self) -> str:
        return f"label:{self.label}" if self.kind == "label" else self.kind
