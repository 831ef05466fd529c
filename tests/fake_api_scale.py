"""The `scale` subresource on the fake API server, for tests only, served as kube-apiserver serves it.

`ScaleSubresource` is the part of `FakeApiServer` that answers `.../{name}/scale` of the kinds that have
one (deployments, statefulsets, replicasets; leaderworkersets as apiextensions serves a CRD's): GET is an
autoscaling/v1 `Scale` built from the parent (its identity and resourceVersion, `spec.replicas`,
`status.replicas`, the pod selector as a string), PUT and PATCH change only the parent's `spec.replicas`
and move its resourceVersion on (and its `metadata.generation`, when the replicas change: the write goes
through the parent's strategy), with the API server's 404, 409 and 422 for a missing parent, a stale
resourceVersion or uid, and negative replicas.

This module must only rescale: it writes `spec.replicas` and nothing else of the parent (no status, no
pods; no controller acts on the change), but for what the registry sets itself (resourceVersion,
generation).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from tests.fake_api_core import FakeApiCore
from tests.fake_api_errors import MODIFIED, ApiError, conflict_error, invalid_error
from tests.fake_api_kinds import JsonObj, Kind, set_generation
from tests.fake_api_patches import apply_patch
from tests.fake_api_selectors import selector_string


class ScaleSubresource(FakeApiCore):
    """`.../{name}/scale`: the parent's replicas as an autoscaling/v1 Scale, read and written."""

    @staticmethod
    def _scale_of(kind: Kind, obj: JsonObj) -> JsonObj:
        """The autoscaling/v1 Scale of a parent (the registry's scaleFromDeployment / scaleFromStatefulSet,
        apiextensions' scaleFromCustomResource): the parent's identity and resourceVersion, its
        spec.replicas, status.replicas and pod selector as a string."""
        assert kind.scale_selector is not None
        meta = obj["metadata"]
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        where: Any = obj
        for part in kind.scale_selector:
            where = where.get(part) if isinstance(where, Mapping) else None
        selector = where if isinstance(where, str) else selector_string(where)
        scale_meta = {
            key: meta[key] for key in ("name", "namespace", "uid", "resourceVersion") if key in meta
        }
        if meta.get("creationTimestamp"):
            scale_meta["creationTimestamp"] = meta["creationTimestamp"]
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": scale_meta,
            "spec": {"replicas": int(spec.get("replicas") or 0)},
            "status": {"replicas": int(status.get("replicas") or 0), "selector": selector},
        }

    def _rescale(
        self, kind: Kind, ns: str, name: str, *, method: str, body: Any, ctype: str, dry_run: bool
    ) -> tuple[int, JsonObj]:
        """PUT or PATCH of `.../{name}/scale`: only the parent's spec.replicas changes (and its
        resourceVersion moves on, its generation too when the replicas change), as the apps registry's
        ScaleREST.Update and apiextensions' do.

        The parent must exist (404 naming it). A PATCH applies to the current Scale. The Scale's
        resourceVersion is the parent's: a stale one is a 409 naming the parent; an empty one replaces
        unconditionally. A uid that is not the parent's is a 409 precondition failure; negative replicas
        are a 422 (autoscaling's ValidateScale, a CRD's scale spec validation)."""
        current = self._existing(kind, ns, name)
        old_scale = self._scale_of(kind, current)
        if method == "PATCH":
            scale = apply_patch(kind, old_scale, body, ctype)
        elif isinstance(body, dict):
            scale = body
        else:
            raise ApiError(400, "the body of the request was in an unknown format")
        if not isinstance(scale, dict):
            raise ApiError(422, "the patched object is not an object")
        meta = scale.get("metadata") or {}
        if method == "PUT" and meta.get("name") != name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        replicas = (scale.get("spec") or {}).get("replicas", 0)
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise ApiError(
                400,
                f"json: cannot unmarshal {type(replicas).__name__} into Go struct field "
                "ScaleSpec.spec.replicas of type int32",
            )
        if replicas < 0:
            if kind.custom:
                raise invalid_error(
                    kind.group,
                    kind.kind,
                    name,
                    path=".spec.replicas",
                    value=str(replicas),
                    why="should be a non-negative integer",
                )
            raise invalid_error(
                "autoscaling",
                "Scale",
                name,
                path="spec.replicas",
                value=str(replicas),
                why="must be greater than or equal to 0",
            )
        parent_meta = current["metadata"]
        uid = meta.get("uid")
        if uid and uid != parent_meta.get("uid"):
            raise ApiError(
                409,
                f'Operation cannot be fulfilled on {kind.resource}/scale.{kind.group} "{name}": '
                f"Precondition failed: UID in precondition: {uid}, "
                f"UID in object meta: {parent_meta.get('uid')}",
                name=name,
                group_kind=(kind.group, f"{kind.resource}/scale"),
            )
        wanted = meta.get("resourceVersion")
        if wanted and wanted != parent_meta.get("resourceVersion"):
            raise conflict_error(kind, name, MODIFIED)
        updated = copy.deepcopy(current)
        updated.setdefault("spec", {})["replicas"] = replicas
        # ScaleREST updates the parent through its store, so its strategy's PrepareForUpdate runs too.
        set_generation(current, updated)
        if not dry_run:
            updated["metadata"]["resourceVersion"] = self._next_rv()
            self._store(kind)[self._key(kind, ns, name)] = updated
            self._emit(kind, "MODIFIED", updated, current)
        return 200, self._scale_of(kind, updated)
