"""Reading YAML from operators' files (policies, snapshot directories) safely and predictably.

Owns the one YAML loader of the rebalancer: PyYAML's safe subset (libyaml's parser when present), with

- timestamps left as strings, so that every date is read by `rebalancer.rfc3339` and an impossible one
  (`2026-02-30T00:00:00Z`) is a located error rather than a constructor crash;
- no base-60 numbers: `10:00` is the string it is in Kubernetes' YAML, never YAML 1.1's 600 (a duration
  written so is refused rather than read as ten minutes);
- nesting bounded (`MAX_DEPTH` levels), so a file of thousands of `[` is refused instead of exhausting
  the stack;
- aliases bounded: together they may repeat at most `MAX_ALIAS_NODES` nodes, and none may refer to a
  collection that contains it, so an alias bomb is refused at once instead of running for minutes in
  whatever walks the data afterwards.

The bounds live in a Python composer: over libyaml's parser for snapshot files (`load_all`, 1.5x the
time of libyaml's own composer), over PyYAML's Python parser for policies (`compose_and_load`, whose
syntax messages policy authors know).

Errors are `yaml.MarkedYAMLError`s (with the line), as PyYAML's own. It must not open files: callers
pass text and report errors with the file name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml
from yaml.composer import Composer, ComposerError
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from rebalancer.wording import quoted

__all__ = [
    "MAX_ALIAS_NODES",
    "MAX_DEPTH",
    "compose_and_load",
    "items_with_repeats",
    "load",
    "load_all",
    "problem_of",
]

MAX_DEPTH = 100
MAX_ALIAS_NODES = 10_000
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"


class _Resolver(Resolver):
    """YAML 1.1's implicit types without timestamps (a date is a string until `rfc3339` reads it) and
    without base-60 numbers (`10:00` is a string, as Kubernetes' YAML reads it, not the integer 600)."""


_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
# PyYAML's int and float patterns less their base-60 alternatives (`1:30`, `1:30.5`).
_NUMBERS = {
    _INT_TAG: re.compile(
        r"""^(?:[-+]?0b[0-1_]+
        |[-+]?0[0-7_]+
        |[-+]?(?:0|[1-9][0-9_]*)
        |[-+]?0x[0-9a-fA-F_]+)$""",
        re.X,
    ),
    _FLOAT_TAG: re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
        |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
}
_Resolver.yaml_implicit_resolvers = {
    first: [(tag, _NUMBERS.get(tag, regexp)) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
    for first, resolvers in Resolver.yaml_implicit_resolvers.items()
}


class _Constructor(SafeConstructor):
    """The safe constructor, with a value its tag cannot hold (`!!int abc`, `!!float x`) a located
    ConstructorError, and an explicit `!!timestamp` a string as an implicit one is."""

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, OverflowError) as exc:
            problem = f"cannot read {quoted(node.value)} as {node.tag.rsplit(':', 1)[-1]}: {exc}"
            raise ConstructorError(None, None, problem, node.start_mark) from None


_Constructor.add_constructor(_TIMESTAMP_TAG, _Constructor.construct_yaml_str)  # type: ignore[type-var]


class _BoundedComposer(Composer):  # the parser's methods come from the loader it is mixed into
    """PyYAML's composer with depth and alias bounds (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._depth = 0
        self._open_anchors: list[str] = []
        self._alias_nodes = 0
        self._sizes: dict[int, int] = {}
        # Refuse a key given twice in one mapping (YAML would keep the last value silently). Policies
        # leave it off: they list every duplicate at once (`policy.duplicate_keys`).
        self.refuse_duplicate_keys = False

    def compose_mapping_node(self, anchor: Any) -> MappingNode:  # the anchor's name or None
        node: MappingNode = super().compose_mapping_node(anchor)
        if self.refuse_duplicate_keys:
            for key, _, seen in items_with_repeats(node):
                if seen is not None:
                    problem = f"found duplicate key {quoted(key.value)} (also on line {seen})"
                    raise ComposerError(None, None, problem, key.start_mark)
        return node

    def compose_document(self) -> Node | None:
        self._alias_nodes = 0
        self._sizes = {}
        node: Node | None = super().compose_document()
        return node

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        parser: Any = self
        if parser.check_event(AliasEvent):
            event = parser.peek_event()
            if event.anchor in self._open_anchors:
                raise ComposerError(
                    None,
                    None,
                    f"alias *{event.anchor} refers to a collection that contains it",
                    event.start_mark,
                )
            node = super().compose_node(parent, index)
            self._alias_nodes += self._size(node) if node is not None else 0
            if self._alias_nodes > MAX_ALIAS_NODES:
                problem = f"aliases repeat more than {MAX_ALIAS_NODES} nodes (refused as an alias bomb)"
                raise ComposerError(None, None, problem, event.start_mark)
            return node
        event = parser.peek_event()
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        anchor = event.anchor
        if anchor is not None:
            self._open_anchors.append(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor is not None:
                self._open_anchors.pop()
        return node

    def _size(self, root: Node) -> int:
        """Nodes under `root`, aliases counted as often as they appear (memoised per node)."""
        known = self._sizes.get(id(root))
        if known is not None:
            return known
        total = 0
        stack: list[Node] = [root]
        while stack:
            node = stack.pop()
            cached = self._sizes.get(id(node))
            if cached is not None and node is not root:
                total += cached
                continue
            total += 1
            if isinstance(node, SequenceNode):
                stack.extend(node.value)
            elif isinstance(node, MappingNode):
                for key, value in node.value:
                    stack.extend((key, value))
            if total > MAX_ALIAS_NODES:
                break
        self._sizes[id(root)] = total
        return total


def items_with_repeats(node: MappingNode) -> Iterator[tuple[Node, Node, int | None]]:
    """Each (key, value) of a mapping in order, with the 1-based line its scalar key was first given on
    when it is given again (YAML keeps only the last value), else None; merge keys (`<<`) are no
    repeat."""
    first: dict[tuple[str, str], int] = {}
    for key, value in node.value:
        seen: int | None = None
        if isinstance(key, ScalarNode) and key.value != "<<":
            name = (key.tag, key.value)
            seen = first.get(name)
            if seen is None:
                first[name] = key.start_mark.line + 1
        yield key, value, seen


class _PythonLoader(
    yaml.reader.Reader,
    yaml.scanner.Scanner,
    yaml.parser.Parser,
    _BoundedComposer,
    _Constructor,
    _Resolver,
):
    """PyYAML's own parser: the messages policy authors see (small files, so its speed does not matter)."""

    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        _BoundedComposer.__init__(self)
        _Constructor.__init__(self)
        _Resolver.__init__(self)


_CParser: Any = getattr(getattr(yaml, "cyaml", None), "CParser", None)

if _CParser is not None:

    class _LibyamlLoader(_BoundedComposer, _CParser, _Constructor, _Resolver):  # type: ignore[misc]
        """libyaml's parser, for snapshot files of hundreds of MB."""

        def __init__(self, stream: str) -> None:
            _CParser.__init__(self, stream)
            _BoundedComposer.__init__(self)
            _Constructor.__init__(self)
            _Resolver.__init__(self)

    _FastLoader: type = _LibyamlLoader
else:  # pragma: no cover - PyYAML built without libyaml
    _FastLoader = _PythonLoader


def load_all(text: str) -> Iterator[object]:
    """Every document of a YAML stream (a snapshot file), one at a time; a key given twice in one mapping
    is an error. Raises yaml.YAMLError."""
    loader = _FastLoader(text)
    loader.refuse_duplicate_keys = True
    try:
        while loader.check_node():
            node = loader.get_node()
            yield loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


def load(text: str) -> object:
    """The single document of a YAML text (None when empty). Raises yaml.YAMLError."""
    return compose_and_load(text)[1]


def compose_and_load(text: str) -> tuple[Node | None, object]:
    """The node tree (for line numbers) and the data of a single-document YAML text (a policy)."""
    loader = _PythonLoader(text)
    try:
        node = loader.get_single_node()
        return node, (loader.construct_document(node) if node is not None else None)
    finally:
        loader.dispose()


def problem_of(exc: yaml.YAMLError, text: str | None = None) -> tuple[int | None, str]:
    """The 1-based line (None when unknown) and a one-line description of a YAML error; `text` (the
    document) places an unreadable character, which PyYAML reports by position."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "syntax error"
        if exc.context and problem.startswith("but "):
            problem = f"{exc.context}, {problem}"  # "expected a single document ..., but found another"
        return (mark.line + 1 if mark is not None else None), _one_line(problem)
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1 if text is not None else None
        char = exc.character
        what = f"#x{char:04x}" if isinstance(char, int) else f"#x{ord(char):04x}" if char else repr(char)
        return line, f"unacceptable character {what}: {exc.reason}"
    return None, _one_line(str(exc))


def _one_line(text: str) -> str:
    return " ".join(text.split())
