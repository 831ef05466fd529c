"""Strategy registry: `@strategy("name", Args)` binds a pure function to its validated arguments.

Owns the plugin contract: a strategy is `(Snapshot, Args, StrategyContext) -> StrategyResult` and
must be pure (no I/O, no clock, no evictions). This module must not import any strategy eagerly
except through `load_builtin_strategies()`, and must not know about policies, sources or sinks.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Self, TypeVar

from pydantic import BaseModel, ConfigDict

from rebalancer.model import Pod, Snapshot, StrategyResult


class StrategyArgs(BaseModel):
    """Base of every strategy's arguments: unknown keys are errors, values are immutable, and each
    field's docstring is its description (`rebalancer strategies` prints it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    # Whether the strategy needs DCGM telemetry with these arguments (it is skipped when telemetry is
    # unavailable, never run on missing data).
    requires_telemetry: ClassVar[bool] = False

    def telemetry_windows(self) -> frozenset[int]:
        """Window lengths (seconds) this strategy reads telemetry over."""
        return frozenset()

    def usage_period(self) -> tuple[int, int] | None:
        """The long window and step (seconds) of GPU usage history (`rebalancer.usage`) this strategy
        reads from `Snapshot.usage`; None when it reads none."""
        return None

    def needs_telemetry(self) -> bool:
        return self.requires_telemetry

    def without_telemetry(self) -> tuple[Self, str | None]:
        """These arguments for a run that has no telemetry at all (a trace replay), and a sentence on how
        their telemetry thresholds are treated there; None when they read no telemetry. By default a
        strategy that needs telemetry keeps its arguments and the cycle skips it: nothing is ever judged
        idle or under-used without evidence. A strategy whose judgement stands on allocation alone when
        its telemetry threshold is dropped overrides this."""
        if not self.needs_telemetry():
            return self, None
        return self, "not run: it needs GPU telemetry to judge anything"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a pod (or a proposal) may not be evicted: a stable guard name and a human reason."""

    guard: str
    reason: str


PodRefusalCheck = Callable[[Pod], Refusal | None]


def _never_refuse(_pod: Pod) -> Refusal | None:
    return None


@dataclass(frozen=True)
class StrategyContext:
    """Pure helpers a strategy may consult, built by the orchestrator from the policy.

    `refusal(pod)` runs the static per-pod guards (daemonset, opt-out, namespace, ...), so a strategy can
    avoid proposing a node it could never drain whole; `first_refusal(pods)` runs them on several pods
    in order (the cycle's keeps its answers per tuple of pods: asking again with the same tuple is
    cheap). `first_held_back(pods)` says which pod the history holds back this cycle (the planner's
    cooldown and disruption budget, `planner.history_refusal`): a strategy still proposes such a move,
    for the planner to refuse and count, but spends none of its own per-cycle turns on it.
    `gpu_prices` maps a GPU model to its hourly price per GPU. Nothing here performs I/O.
    """

    refusal: PodRefusalCheck = _never_refuse
    gpu_prices: Mapping[str, float] = field(default_factory=dict)
    default_gpu_price: float | None = None
    # `first_refusal` as one call, when the orchestrator has a faster one than `refusal` pod by pod.
    refusals: Callable[[Sequence[Pod]], tuple[Pod, Refusal] | None] | None = None
    # What the planner's guards reading the history say of a pod (its workload's cooldown and
    # disruption budget): None when the cycle has no history.
    history_refusal: PodRefusalCheck | None = None

    def first_refusal(self, pods: Sequence[Pod]) -> tuple[Pod, Refusal] | None:
        """The first of `pods` that `refusal` refuses, with the refusal; None when it refuses none."""
        if self.refusals is not None:
            return self.refusals(pods)
        return _first_refused(self.refusal, pods)

    def first_held_back(self, pods: Sequence[Pod]) -> tuple[Pod, Refusal] | None:
        """The first of `pods` the history holds back this cycle (its workload in its cooldown or out of
        its disruption budget), with the planner's refusal; None when it holds back none."""
        check = self.history_refusal
        return None if check is None else _first_refused(check, pods)

    def price_per_gpu_hour(self, gpu_model: str | None) -> float | None:
        if gpu_model is not None and gpu_model in self.gpu_prices:
            return self.gpu_prices[gpu_model]
        return self.default_gpu_price


def _first_refused(check: PodRefusalCheck, pods: Sequence[Pod]) -> tuple[Pod, Refusal] | None:
    """The first of `pods` that `check` refuses, with the refusal; None when it refuses none."""
    return next(((pod, refused) for pod in pods if (refused := check(pod)) is not None), None)


ArgsT = TypeVar("ArgsT", bound=StrategyArgs)
StrategyFn = Callable[[Snapshot, ArgsT, StrategyContext], StrategyResult]


@dataclass(frozen=True)
class StrategySpec(Generic[ArgsT]):
    name: str
    fn: StrategyFn[ArgsT]
    args_model: type[ArgsT]
    summary: str

    def run(self, snapshot: Snapshot, args: StrategyArgs, ctx: StrategyContext) -> StrategyResult:
        if not isinstance(args, self.args_model):
            raise TypeError(f"{self.name}: expected {self.args_model.__name__}, got {type(args).__name__}")
        return self.fn(snapshot, args, ctx)


_REGISTRY: dict[str, StrategySpec[Any]] = {}
_LOADED: list[bool] = []  # not empty once the built-in modules were imported

BUILTIN_MODULES = (
    "strategies.idle_gpu",
    "strategies.gpu_affinity",
    "strategies.gpu_consolidation",
    "strategies.topology_spread",
    "strategies.gpu_rightsizing",
)


def strategy(
    name: str, args_model: type[ArgsT], summary: str
) -> Callable[[StrategyFn[ArgsT]], StrategyFn[ArgsT]]:
    """Register a pure strategy function under a stable name."""

    def register(fn: StrategyFn[ArgsT]) -> StrategyFn[ArgsT]:
        existing = _REGISTRY.get(name)
        if existing is not None and existing.fn is not fn:
            raise ValueError(f"strategy {name!r} is registered twice")
        _REGISTRY[name] = StrategySpec(name=name, fn=fn, args_model=args_model, summary=summary)
        return fn

    return register


def load_builtin_strategies() -> None:
    """Import every built-in strategy module there is (once: every cycle looks strategies up)."""
    if _LOADED:
        return
    for module in BUILTIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    _LOADED.append(True)


def get_strategy(name: str) -> StrategySpec[Any] | None:
    load_builtin_strategies()
    return _REGISTRY.get(name)


def all_strategies() -> Mapping[str, StrategySpec[Any]]:
    load_builtin_strategies()
    return dict(sorted(_REGISTRY.items()))
