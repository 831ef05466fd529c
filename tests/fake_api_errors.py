"""The fake API server's errors, for tests only: each one shaped as kube-apiserver's `Status`.

`ApiError` is raised anywhere inside a request and rendered by the HTTP handler as a `Status` object
(`reason` from the HTTP code unless given, `details` naming the object, its group and kind, the causes
and `retryAfterSeconds`). `not_found_error`, `conflict_error` and `invalid_error` word the API
server's NotFound, Conflict and one-field Invalid errors as apimachinery's constructors do; `MODIFIED` and
`NOT_FOUND_RESOURCE` are its two stock messages. `WatchDropped` is not an answer: it ends an open watch
stream without its last chunk.

This module must only shape errors: when one is raised is the server's business, not this module's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tests.fake_api_kinds import JsonObj, Kind

MODIFIED = "the object has been modified; please apply your changes to the latest version and try again"
NOT_FOUND_RESOURCE = "the server could not find the requested resource"

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class WatchDropped(Exception):
    """An open watch stream cut by `FakeApiServer.drop_watches()`."""


class ApiError(Exception):
    """An error response: raised inside handlers, rendered as a `Status` object."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        kind: Kind | None = None,
        name: str | None = None,
        causes: Sequence[Mapping[str, str]] = (),
        retry_after: int | None = None,
        group_kind: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.kind = kind
        self.name = name
        self.causes = tuple(causes)
        self.retry_after = retry_after
        # (group, kind) for `details` when they name something other than `kind`'s resource (a Scale).
        self.group_kind = group_kind

    def status(self) -> JsonObj:
        details: JsonObj = {}
        if self.name is not None:
            details["name"] = self.name
        group, kind = self.group_kind or (
            (self.kind.group, self.kind.resource) if self.kind is not None else ("", "")
        )
        if group:
            details["group"] = group
        if kind:
            details["kind"] = kind
        if self.causes:
            details["causes"] = [dict(c) for c in self.causes]
        if self.retry_after:
            details["retryAfterSeconds"] = self.retry_after
        body: JsonObj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if details:
            body["details"] = details
        return body


def not_found_error(kind: Kind, name: str) -> ApiError:
    return ApiError(404, f'{kind.qualified} "{name}" not found', kind=kind, name=name)


def conflict_error(kind: Kind, name: str, why: str) -> ApiError:
    return ApiError(
        409, f'Operation cannot be fulfilled on {kind.qualified} "{name}": {why}', kind=kind, name=name
    )


def invalid_error(group: str, kind: str, name: str, *, path: str, value: str, why: str) -> ApiError:
    """apimachinery's NewInvalid for one field error: `Kind.group "name" is invalid: path: Invalid value:
    value: why`, the error as one FieldValueInvalid cause."""
    body = f"Invalid value: {value}: {why}"
    qualified = f"{kind}.{group}" if group else kind
    return ApiError(
        422,
        f'{qualified} "{name}" is invalid: {path}: {body}',
        name=name,
        group_kind=(group, kind),
        causes=[{"reason": "FieldValueInvalid", "message": body, "field": path}],
    )
