"""Typed decoding of the Kubernetes objects the model reads: msgspec Structs, from JSON bytes or mappings.

Owns the one description of which fields of a Node, Pod, PodDisruptionBudget and controller object
(`workloads.KINDS`) the rebalancer reads, with their JSON types, as msgspec Structs named and shaped as
the Kubernetes API types are (`PodSpec`, `ObjectMeta`, ...): decoding straight from bytes (kubectl files,
API pages, watch events) checks every such field's type in C and skips every other field unread;
`convert` takes an already-decoded mapping (a YAML document, a caller's dict) to the same Structs, so
every source reads an object the same way. Every field is optional, and an explicit `null` reads as an
absent field, as the API server's own decoding does.

Also owns turning msgspec's refusal (`Expected `str`, got `int` - at `$.spec.tolerations[0].key``) into
an `ObjectError` worded as the model's own checks word theirs (`Pod ml/x: spec.tolerations[0].key:
expected a string, got the number 5`): the wording follows the field's declared type, the value shown is
looked up in the decoded object, and the object's name and its metadata's problems come first, as they
always have. What JSON types cannot say (required fields, quantities, operators, timestamps) is
`kube_objects`' and `kube_pods`' to check while they build the model.

It must not do I/O, read the clock or build model objects.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar, Union, cast

import msgspec
import msgspec.inspect as mi

from rebalancer.sources.object_fields import ObjectError, object_ref, type_name
from rebalancer.workloads import KINDS

__all__ = [
    "Affinity",
    "Container",
    "ControllerObject",
    "KubeObject",
    "LabelSelector",
    "NodeObject",
    "ObjectMeta",
    "OwnerReference",
    "PdbObject",
    "PodObject",
    "PodSpec",
    "Requirement",
    "ResourceRequirements",
    "Taint",
    "Toleration",
    "TopologySpreadConstraint",
    "VolumeField",
    "VolumeSource",
    "convert",
    "decode",
    "decode_any",
    "decode_item",
    "invalid",
    "kind_of",
    "object_name",
    "type_of",
]

# Timestamps are strings to msgspec (rebalancer.rfc3339 reads them); a wrong type is worded as before.
Timestamp = Annotated[str, msgspec.Meta(extra={"expected": "an RFC 3339 timestamp"})]
# A resource list: names to quantities, strings or numbers (object_fields checks their values).
Quantity = Annotated[str | int | float, msgspec.Meta(extra={"expected": "a quantity such as 500m, 2 or 4Gi"})]
Quantities = dict[str, Quantity]


class _Struct(msgspec.Struct, frozen=True, gc=False, rename="camel", omit_defaults=True):
    """Frozen (hashable where every field is: equal tolerations or affinities share one model object),
    untracked by the cyclic collector (decoded JSON holds no cycles), fields named as the API names them."""


# --------------------------------------------------------------------------- metadata


class OwnerReference(_Struct, frozen=True):
    api_version: str | None = None
    kind: str | None = None
    name: str | None = None
    controller: bool | None = None


class ObjectMeta(_Struct, frozen=True):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: tuple[OwnerReference, ...] | None = None
    creation_timestamp: Timestamp | None = None
    deletion_timestamp: Timestamp | None = None


# --------------------------------------------------------------------------- selectors


class Requirement(_Struct, frozen=True):
    """A label selector's or a node selector term's requirement (key, operator, values)."""

    key: str | None = None
    operator: str | None = None
    values: tuple[str, ...] | None = None


class LabelSelector(_Struct, frozen=True):
    match_labels: dict[str, str] | None = None
    match_expressions: tuple[Requirement, ...] | None = None


class NodeSelectorTerm(_Struct, frozen=True):
    match_expressions: tuple[Requirement, ...] | None = None
    match_fields: tuple[Requirement, ...] | None = None


class NodeSelector(_Struct, frozen=True):
    node_selector_terms: tuple[NodeSelectorTerm, ...] | None = None


class PreferredSchedulingTerm(_Struct, frozen=True):
    weight: int | None = None
    preference: NodeSelectorTerm | None = None


class NodeAffinity(_Struct, frozen=True):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: tuple[PreferredSchedulingTerm, ...] | None = None


class Affinity(_Struct, frozen=True):
    node_affinity: NodeAffinity | None = None


# --------------------------------------------------------------------------- pods


class ResourceRequirements(_Struct, frozen=True):
    requests: Quantities | None = None
    limits: Quantities | None = None


class Container(_Struct, frozen=True):
    resources: ResourceRequirements | None = None
    restart_policy: str | None = None


class Toleration(_Struct, frozen=True):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None


class TopologySpreadConstraint(_Struct, frozen=True):
    max_skew: int | None = None
    topology_key: str | None = None
    when_unsatisfiable: str | None = None
    label_selector: LabelSelector | None = None
    match_label_keys: tuple[str, ...] | None = None
    min_domains: int | None = None


class VolumeSource(_Struct, frozen=True):
    """A volume's source object (`emptyDir: {...}`, `projected: {...}`...): only an emptyDir's medium is
    read, so the rest of a source, such as a projected service-account token's sources, is skipped
    unread instead of being decoded into mappings no one reads (a fifth of a pod's decoding)."""

    medium: Any = None  # untyped: kube_pods names a wrong type by its path, as for any untyped field


# A volume's field: its name (a string), its source (an object), or any other JSON value, each decoded as
# an untyped mapping's would be (the model reads only the name, the kind and an emptyDir's medium).
VolumeField = str | VolumeSource | int | float | bool | list[Any] | None


class PodSpec(_Struct, frozen=True):
    node_name: str | None = None
    scheduler_name: str | None = None
    priority: int | None = None
    priority_class_name: str | None = None
    node_selector: dict[str, str] | None = None
    containers: tuple[Container, ...] | None = None
    init_containers: tuple[Container, ...] | None = None
    overhead: Quantities | None = None
    affinity: Affinity | None = None
    tolerations: tuple[Toleration, ...] | None = None
    topology_spread_constraints: tuple[TopologySpreadConstraint, ...] | None = None
    # A volume's kind is its first field other than `name` (kube_pods), so volumes stay mappings.
    volumes: tuple[dict[str, VolumeField], ...] | None = None


class PodStatus(_Struct, frozen=True):
    phase: str | None = None
    qos_class: str | None = None
    start_time: Timestamp | None = None


class PodObject(_Struct, frozen=True, tag_field="kind", tag="Pod"):
    metadata: ObjectMeta | None = None
    spec: PodSpec | None = None
    status: PodStatus | None = None


# --------------------------------------------------------------------------- nodes


class Taint(_Struct, frozen=True):
    key: str | None = None
    value: str | None = None
    effect: str | None = None


class NodeSpec(_Struct, frozen=True):
    taints: tuple[Taint, ...] | None = None
    unschedulable: bool | None = None


class NodeCondition(_Struct, frozen=True):
    type: str | None = None
    status: str | None = None


class NodeStatus(_Struct, frozen=True):
    allocatable: Quantities | None = None
    capacity: Quantities | None = None
    conditions: tuple[NodeCondition, ...] | None = None


class NodeObject(_Struct, frozen=True, tag_field="kind", tag="Node"):
    metadata: ObjectMeta | None = None
    spec: NodeSpec | None = None
    status: NodeStatus | None = None


# --------------------------------------------------------------------------- PDBs


class PdbSpec(_Struct, frozen=True):
    selector: LabelSelector | None = None


class PdbStatus(_Struct, frozen=True):
    disruptions_allowed: int | None = None


class PdbObject(_Struct, frozen=True, tag_field="kind", tag="PodDisruptionBudget"):
    metadata: ObjectMeta | None = None
    spec: PdbSpec | None = None
    status: PdbStatus | None = None


# --------------------------------------------------------------------------- controllers


class ControllerSpec(_Struct, frozen=True):
    # Read for some kinds only (kube_objects.REPLICATED_KINDS, SUSPENDABLE_KINDS): checked there, so that
    # another kind's field of the same name is never refused.
    replicas: Any = None
    suspend: Any = None


class ControllerObject(_Struct, frozen=True):
    """A controller of any kind (its kind is given apart: the class's tag, or the mapping's `kind`)."""

    api_version: str | None = None
    metadata: ObjectMeta | None = None
    spec: ControllerSpec | None = None


KubeObject = PodObject | NodeObject | PdbObject | ControllerObject

# The kinds decoded by kind from a List's items: the model's, and one tagged class per controller kind.
_CONTROLLER_TYPES: dict[str, type[ControllerObject]] = {
    kind: cast(
        "type[ControllerObject]",
        msgspec.defstruct(kind, [], bases=(ControllerObject,), tag_field="kind", tag=kind, module=__name__),
    )
    for kind in KINDS
}
_TYPES: dict[str, type[KubeObject]] = {
    "Node": NodeObject,
    "Pod": PodObject,
    "PodDisruptionBudget": PdbObject,
    **_CONTROLLER_TYPES,
}
_ANY_KIND = Union[tuple(_TYPES.values())]  # type: ignore[valid-type]  # noqa: UP007


def type_of(kind: str) -> type[KubeObject] | None:
    """The Struct a kind decodes into (None for a kind the model does not read)."""
    return _TYPES.get(kind)


def kind_of(obj: KubeObject) -> str:
    """The kind of an object decoded by `decode_item` (its class's tag)."""
    return str(type(obj).__struct_config__.tag)


# --------------------------------------------------------------------------- decoding

# JSON numbers too large for a float read as infinity, as the standard library reads them, so that a
# quantity of 1e400 is refused by the quantity check, not as malformed JSON.
_DECODERS: dict[object, msgspec.json.Decoder[Any]] = {
    kind: msgspec.json.Decoder(cls, float_hook=float) for kind, cls in _TYPES.items()
}
_ANY_KIND_DECODER: msgspec.json.Decoder[KubeObject] = msgspec.json.Decoder(_ANY_KIND, float_hook=float)
_UNTYPED: msgspec.json.Decoder[Any] = msgspec.json.Decoder(float_hook=float)

_T = TypeVar("_T", bound=msgspec.Struct)


def decode(cls: type[_T], data: bytes | memoryview | msgspec.Raw | str) -> _T:
    """JSON bytes of one object as `cls` (one of this module's object Structs); raises msgspec's
    ValidationError for a field of the wrong type (see `invalid`) and DecodeError for invalid JSON."""
    return _decoder(cls).decode(data)  # type: ignore[no-any-return]


def decode_item(data: bytes | memoryview | msgspec.Raw | str, kind: str | None) -> KubeObject:
    """A List's item: as `kind`'s Struct when the List is typed (`PodList` items carry no kind), else by
    its own `kind`. Raises ValidationError for an object of another kind too (the caller reads it
    untyped then)."""
    if kind is None:
        return _ANY_KIND_DECODER.decode(data)
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise msgspec.ValidationError(f"{kind} is not a kind the model reads")
    return decoder.decode(data)  # type: ignore[no-any-return]


def decode_any(data: bytes | memoryview | msgspec.Raw | str) -> Any:
    """JSON bytes untyped (dicts and lists), as the standard library would read them."""
    return _UNTYPED.decode(data)


def _decoder(cls: type[msgspec.Struct]) -> msgspec.json.Decoder[Any]:
    decoder = _DECODERS.get(cls)
    if decoder is None:
        decoder = _DECODERS[cls] = msgspec.json.Decoder(cls, float_hook=float)
    return decoder


def convert(cls: type[_T], obj: object, kind: str, *, namespaced: bool = True) -> _T:
    """A decoded object (a mapping from YAML or a caller) as `cls`; ObjectError worded as `invalid`.
    Its `kind` field is not read (the caller says which kind it is)."""
    obj = _plain(obj)
    tag = cls.__struct_config__.tag
    if tag is not None and isinstance(obj, Mapping) and obj.get("kind", tag) != tag:
        obj = {key: value for key, value in obj.items() if key != "kind"}
    try:
        return msgspec.convert(obj, cls)
    except msgspec.ValidationError as exc:
        raise invalid(cls, obj, exc, kind, namespaced=namespaced) from None


def _plain(value: object) -> object:
    """`value` with every mapping that is not a dict made one (msgspec would read a key such as `values`
    as the mapping's method); the same object when there is none."""
    if type(value) is dict:
        copied: dict[Any, object] | None = None
        for key, item in value.items():
            plain = _plain(item)
            if plain is not item:
                copied = copied if copied is not None else dict(value)
                copied[key] = plain
        return copied if copied is not None else value
    if type(value) is list:
        items = [_plain(item) for item in value]
        return items if any(new is not old for new, old in zip(items, value, strict=True)) else value
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return value


# --------------------------------------------------------------------------- names and errors


def object_name(kind: str, meta: ObjectMeta | None, *, namespaced: bool) -> str:
    """`namespace/name` as messages name an object (the namespace defaulted, as the API server defaults
    it), or `name`; ObjectError when the name is missing."""
    name = meta.name if meta is not None else None
    namespace = meta.namespace if meta is not None else None
    if not name:
        ref = f"{namespace}/<unnamed>" if namespace else "<unnamed>"
        raise ObjectError(kind, ref, "metadata.name", "required field is missing")
    if not namespaced:
        return name
    return f"{namespace or 'default'}/{name}"


def invalid(
    cls: type[msgspec.Struct],
    obj: object,
    error: msgspec.ValidationError,
    kind: str,
    *,
    namespaced: bool = True,
) -> ObjectError:
    """The ObjectError for `obj` (decoded untyped), which msgspec refused as `cls` with `error`.

    The object's metadata is checked first (a non-object, a name or namespace of the wrong type, no
    name), as the model's checks always began with it; then msgspec's path is followed in `obj` to the
    field it refused, whose declared type says what was expected."""
    if not isinstance(obj, Mapping):
        return ObjectError(kind, "<unnamed>", "", f"expected an object, got {type_name(obj)}")
    ref = object_ref(obj)
    meta = obj.get("metadata")
    if meta is not None and not isinstance(meta, Mapping):
        return ObjectError(kind, ref, "metadata", f"expected an object, got {type_name(meta)}")
    meta = meta or {}
    for key in ("name", "namespace") if namespaced else ("name",):
        value = meta.get(key)
        if value is not None and not isinstance(value, str):
            return ObjectError(kind, ref, f"metadata.{key}", f"expected a string, got {type_name(value)}")
    if not meta.get("name"):
        return ObjectError(kind, ref, "metadata.name", "required field is missing")
    name = meta["name"] if not namespaced else f"{meta.get('namespace') or 'default'}/{meta['name']}"
    path, message = _located(mi.type_info(cls), obj, str(error))
    return ObjectError(kind, name, path, message)


_AT = re.compile(r"^(?P<what>.*?) - at `(?:key` in `)?\$(?P<path>[^`]*)`$", re.DOTALL)
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[\.\.\.\]")


def _located(info: mi.Type, obj: object, error: str) -> tuple[str, str]:
    """(field path as the model names it, message) for msgspec's `error` about `obj` decoded as `info`."""
    match = _AT.match(error)
    if match is None:  # at the top level: not an object
        return "", f"expected an object, got {type_name(obj)}"
    key_error = "` in `$" in error
    names: list[str] = []
    value: object = obj
    declared: mi.Type = info
    for step in _STEP.finditer(match["path"]):
        field, index = step.group(1), step.group(2)
        declared = _unwrapped(declared)
        if field is not None:
            names.append(f".{field}")
            value = value.get(field) if isinstance(value, Mapping) else None
            declared = _field_type(declared, field)
        elif index is not None:
            if _is_string_list(declared):  # the model names the list itself: "a list of strings"
                break
            names.append(f"[{index}]")
            value = value[int(index)] if isinstance(value, list | tuple) else None
            declared = getattr(declared, "item_type", mi.AnyType())
        else:  # a mapping's value: the first one of the wrong type, by key
            key, value = _first_wrong(value, getattr(declared, "value_type", mi.AnyType()))
            names.append(f".{key}")
            declared = getattr(declared, "value_type", mi.AnyType())
    path = "".join(names).removeprefix(".")
    if key_error and isinstance(value, Mapping):
        bad = next((k for k in value if not isinstance(k, str)), None)
        return path, f"expected an object with string keys, got the key {type_name(bad)}"
    return path, f"{_expected(declared)}{_got(declared, value)}"


def _unwrapped(declared: mi.Type) -> mi.Type:
    """The declared type without its `| None` (and its annotations)."""
    if isinstance(declared, mi.UnionType):
        kept = [t for t in declared.types if not isinstance(t, mi.NoneType)]
        declared = kept[0] if len(kept) == 1 else declared
    return declared


def _field_type(declared: mi.Type, name: str) -> mi.Type:
    if isinstance(declared, mi.StructType):
        for field in declared.fields:
            if field.encode_name == name:
                return field.type
    return mi.AnyType()


def _is_string_list(declared: mi.Type) -> bool:
    declared = _unwrapped(declared)
    return isinstance(declared, mi.VarTupleType | mi.ListType) and isinstance(
        _unwrapped(declared.item_type), mi.StrType
    )


def _first_wrong(value: object, declared: mi.Type) -> tuple[str, object]:
    """The first (key, value) of a mapping whose value is not of `declared`'s type (a string)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not _holds(declared, item):
                return str(key), item
    return "", value


def _holds(declared: mi.Type, value: object) -> bool:
    """Whether msgspec takes `value` as `declared` (for the types of mapping values)."""
    if isinstance(declared, mi.Metadata):
        declared = declared.type
    if isinstance(declared, mi.UnionType):
        return any(_holds(one, value) for one in declared.types)
    if isinstance(declared, mi.StrType):
        return isinstance(value, str)
    if isinstance(declared, mi.IntType):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(declared, mi.FloatType):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(declared, mi.NoneType):
        return value is None
    return True


_EXPECTED: dict[type, str] = {
    mi.StrType: "expected a string",
    mi.IntType: "expected an integer",
    mi.BoolType: "expected true or false",
    mi.StructType: "expected an object",
    mi.DictType: "expected an object",
    mi.VarTupleType: "expected a list",
    mi.ListType: "expected a list",
}


def _expected(declared: mi.Type) -> str:
    declared = _unwrapped(declared)
    if isinstance(declared, mi.Metadata):
        wording = (declared.extra or {}).get("expected")
        if wording:
            return f"expected {wording}"
        declared = declared.type
    if _is_string_list(declared):
        return "expected a list of strings"
    return _EXPECTED.get(type(declared), "expected another type")


def _got(declared: mi.Type, value: object) -> str:
    return "" if _is_string_list(declared) else f", got {type_name(value)}"
