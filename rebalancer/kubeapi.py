"""The Kubernetes API helper every reader and writer of the cluster goes through.

Owns connecting to a cluster and saying what went wrong:

- `load_api_client(kubeconfig, context)`: `--kubeconfig` / `--context` when given, else in-cluster
  config inside a pod (`KUBERNETES_SERVICE_HOST`), else `KUBECONFIG` (one file or a `:`-separated list,
  merged as kubectl merges them), else `~/.kube/config`. A kubeconfig that is missing, unreadable, not
  YAML or lacks the context raises `KubeConfigError` (bad input: exit 2) naming the file, the line
  where known, every place tried and how to point at a cluster;
- `describe_api_error` / `describe_transport_error`: one line for an API answer (`HTTP 500 Internal
  Server Error: <the Status message>`) or a transport failure (`connection refused`, `timed out`,
  `connection dropped`), as an operator would say it;
- `is_transient`: the one rule of what is worth retrying (no answer, 429 throttling, 5xx, transport),
  and `with_retries`, the one way every reader and writer retries a request (tenacity: bounded
  attempts, a backoff, an injectable sleep), a caller narrowing the rule where an answer is final (a
  PDB's 429 to an eviction);
- `read_or_none` / `release_unread` / `read_json`: raw responses (`_preload_content=False`) read once
  and given back to the connection pool clean.

It must not decide anything about the cluster's objects: sources read, the evictor and actuator write.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar, cast

import tenacity
import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from rebalancer import yaml_input
from rebalancer.errors import InputError
from rebalancer.wording import clip

__all__ = [
    "Backoff",
    "KubeConfigError",
    "describe_answer",
    "describe_api_error",
    "describe_error",
    "describe_transport_error",
    "exponential_backoff",
    "is_transient",
    "load_api_client",
    "read_json",
    "read_or_none",
    "release_unread",
    "status_body",
    "status_message",
    "with_retries",
]

DEFAULT_KUBECONFIG = "~/.kube/config"
_HOW_TO_POINT = (
    "point at a cluster with --kubeconfig FILE (and --context NAME), set KUBECONFIG, run inside a pod "
    "with a service account, or analyse a snapshot offline with --snapshot DIR"
)


class KubeConfigError(InputError):
    """No usable Kubernetes client configuration: a kubeconfig to fix or to point at."""


# --------------------------------------------------------------------------- loading


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """An ApiClient for the cluster the flags, the pod or the kubeconfig name (see the module docstring)."""
    in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if kubeconfig is None and context is None and in_pod:
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except (ConfigException, OSError, ValueError) as exc:
            raise KubeConfigError([f"cannot load in-cluster Kubernetes config: {exc}"]) from None
        return client.ApiClient(configuration)
    files = _kubeconfig_files(kubeconfig, in_pod=in_pod)
    for path in files:
        _check_kubeconfig(path)
    try:
        api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=os.pathsep.join(files), context=context, persist_config=False
        )
    except (ConfigException, OSError, ValueError, TypeError, AttributeError, yaml.YAMLError) as exc:
        where = ", ".join(files)
        if context is not None and f"name {context} " in str(exc):
            raise KubeConfigError([f"{where}: context {context!r} is not in the kubeconfig"]) from None
        raise KubeConfigError([f"{where}: not a usable kubeconfig: {clip(str(exc), 300)}"]) from None
    return cast("client.ApiClient", api_client)


def _kubeconfig_files(kubeconfig: str | None, *, in_pod: bool) -> list[str]:
    """The kubeconfig files to merge; KubeConfigError listing what was tried when there are none."""
    if kubeconfig is not None:
        return [kubeconfig]
    variable = os.environ.get("KUBECONFIG")
    if variable:
        named = [part for part in variable.split(os.pathsep) if part]
        present = [part for part in named if Path(part).expanduser().is_file()]
        if present:
            return [str(Path(part).expanduser()) for part in present]
        tried = [f"KUBECONFIG={variable} (no such file)"]
    else:
        default = Path(DEFAULT_KUBECONFIG).expanduser()
        if default.is_file():
            return [str(default)]
        tried = ["KUBECONFIG (not set)", f"{default} (does not exist)"]
    if not in_pod:
        tried.append("in-cluster (KUBERNETES_SERVICE_HOST not set)")
    raise KubeConfigError([f"no Kubernetes configuration found: tried {', '.join(tried)}; {_HOW_TO_POINT}"])


def _check_kubeconfig(path: str) -> None:
    """A located KubeConfigError for a kubeconfig file that cannot be read or is not a YAML mapping."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise KubeConfigError([f"{path}: cannot read kubeconfig: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise KubeConfigError([f"{path}: not a valid kubeconfig: not UTF-8 text ({exc.reason})"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        line, problem = yaml_input.problem_of(exc, text)
        where = f"{path}:{line}" if line is not None else path
        raise KubeConfigError([f"{where}: not a valid kubeconfig: {clip(problem, 300)}"]) from None
    if not isinstance(data, dict):
        raise KubeConfigError(
            [f"{path}: not a valid kubeconfig: expected a mapping with clusters and contexts"]
        )


# --------------------------------------------------------------------------- errors


def is_transient(exc: BaseException) -> bool:
    """Worth another try: no answer (status 0), 429 throttling, a 5xx, or a transport failure."""
    if isinstance(exc, ApiException):
        status = exc.status or 0
        return status in (0, 429) or status >= 500
    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)


def status_body(exc: ApiException) -> dict[str, Any]:
    """The metav1.Status the API server answered with, or {}."""
    try:
        body = json.loads(exc.body or "")
    except (ValueError, TypeError):
        return {}
    return body if isinstance(body, dict) else {}


def status_message(exc: ApiException) -> str:
    """The Status message of an API error, else its reason or body, never empty."""
    message = status_body(exc).get("message")
    if isinstance(message, str) and message:
        return message
    return str(exc.reason or (exc.body or "").strip()[:200] or "no message")


def describe_api_error(exc: ApiException) -> str:
    """`HTTP 409 Conflict: <the Status message>`."""
    message = status_body(exc).get("message")
    head = f"HTTP {exc.status} {exc.reason or ''}".rstrip()
    if isinstance(message, str) and message:
        return f"{head}: {message}"
    body = (exc.body or "").strip() if isinstance(exc.body, str) else ""
    return f"{head}: {body[:200]}" if body and not body.startswith("{") else head


def describe_transport_error(exc: BaseException) -> str:
    """A refused connection, a timeout or a dropped connection, as an operator would say it."""
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    # urllib3's NewConnectionError is a ConnectTimeoutError subclass: a refusal must be told apart first.
    if isinstance(exc, urllib3.exceptions.NewConnectionError | ConnectionRefusedError):
        cause = exc.__context__ or exc
        if isinstance(cause, ConnectionRefusedError) or "Connection refused" in str(exc):
            return f"connection refused ({_transport_where(exc)})"
        return f"cannot connect ({exc})"
    if isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError):
        return f"timed out ({exc})"
    if isinstance(exc, urllib3.exceptions.ProtocolError):
        cause = exc.args[1] if len(exc.args) > 1 else exc
        return f"connection dropped ({cause})"
    if isinstance(exc, ConnectionError):
        return f"cannot connect ({exc})"
    return f"{type(exc).__name__}: {exc}"


def _transport_where(exc: BaseException) -> str:
    connection = getattr(exc, "conn", None) or getattr(exc, "pool", None)
    host, port = getattr(connection, "host", None), getattr(connection, "port", None)
    return f"{host}:{port}" if host else str(exc)


def describe_answer(exc: BaseException) -> str:
    """The short form the write edges use: `HTTP 409: <message>`, `no valid answer: ...`, or the transport
    failure."""
    if isinstance(exc, ApiException):
        status = exc.status or 0
        return (
            f"HTTP {status}: {status_message(exc)}" if status else f"no valid answer: {status_message(exc)}"
        )
    return describe_transport_error(exc)


def describe_error(exc: BaseException) -> str:
    """`describe_api_error` for an API answer, `describe_transport_error` for anything else."""
    return describe_api_error(exc) if isinstance(exc, ApiException) else describe_transport_error(exc)


# --------------------------------------------------------------------------- retries and raw responses

T = TypeVar("T")

Backoff = Callable[[int], float]
"""Seconds to wait before retry number `attempt + 1` (attempt counts from 0)."""


def exponential_backoff(base: float = 0.5, cap: float = 8.0) -> Backoff:
    """base, 2*base, 4*base... seconds, at most `cap`."""

    def backoff(attempt: int) -> float:
        return float(min(base * 2**attempt, cap))

    return backoff


def with_retries(
    request: Callable[[], T],
    *,
    retries: int,
    backoff: Backoff | None = None,
    sleep: Callable[[float], None] = time.sleep,
    retry_if: Callable[[BaseException], bool] = is_transient,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """`request()`, tried again up to `retries` more times while it fails in a way `retry_if` calls
    transient (`is_transient` by default), `on_retry` told of each failure that is retried; the last
    failure is raised as it came."""
    wait = backoff or exponential_backoff()

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None and (exc := state.outcome.exception()):
            on_retry(exc)

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(retries + 1),
        wait=lambda state: wait(state.attempt_number - 1),
        retry=tenacity.retry_if_exception(retry_if),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    return retrying(request)


def read_or_none(request: Callable[[], object]) -> bytes | None:
    """The body of a read made with `_preload_content=False`; None when the object does not exist (404)."""
    try:
        response = cast(urllib3.BaseHTTPResponse, request())
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    try:
        return bytes(response.data)
    finally:
        response.release_conn()


def release_unread(response: urllib3.BaseHTTPResponse) -> None:
    """Drain an unread body before the connection goes back to the pool, so no stale bytes stay on it."""
    with suppress(urllib3.exceptions.HTTPError, OSError):
        response.drain_conn()
    response.release_conn()


def read_json(response: urllib3.BaseHTTPResponse) -> Mapping[str, Any]:
    """A raw response's JSON object ({} for anything else); the connection goes back to the pool."""
    try:
        data = response.data
    finally:
        response.release_conn()
    doc = json.loads(data)
    return doc if isinstance(doc, dict) else {}
