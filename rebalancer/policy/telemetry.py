"""The policy's `telemetry:` section: which DCGM metrics and labels to read, from which Prometheus.

Owns the metric names and scales, the label mapping (series identity), presets, the freshness and
scrape-interval bounds that make an answer plausible, and the Prometheus connection (URL, where its
credentials live, timeouts, the cycle's deadline). Secrets never live here, only where to find them.
It must not read telemetry or talk to Prometheus.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError, model_validator

from rebalancer.errors import InputError
from rebalancer.policy.fields import Duration, StrictModel, refuse_secrets_over_plain_http
from rebalancer.redaction import redact_url
from rebalancer.wording import quoted

__all__ = [
    "LabelMapping",
    "MetricConfig",
    "PrometheusConfig",
    "TelemetryConfig",
    "TelemetryPreset",
    "prometheus_with_url",
]


class MetricConfig(StrictModel):
    name: str = Field(min_length=1, pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
    # Multiply raw samples by this to reach the model's unit (percent for utilisation, MiB for memory).
    scale: float = Field(default=1.0, gt=0, allow_inf_nan=False)


class LabelMapping(StrictModel):
    """Label names to try, in order, for each piece of identity; the first one present and non-empty wins."""

    node: tuple[str, ...] = ("Hostname", "hostname", "kubernetes_node", "node")
    pod: tuple[str, ...] = ("exported_pod", "pod")
    namespace: tuple[str, ...] = ("exported_namespace", "namespace")
    uuid: tuple[str, ...] = ("UUID", "uuid")
    gpu_index: tuple[str, ...] = ("gpu",)
    model_name: tuple[str, ...] = ("modelName",)
    mig_profile: tuple[str, ...] = ("GPU_I_PROFILE",)
    mig_instance: tuple[str, ...] = ("GPU_I_ID",)


TelemetryPreset = Literal["dcgm-exporter", "dcgm-exporter-legacy", "dcgm-exporter-exported", "nv-gpu"]


class PrometheusConfig(StrictModel):
    url: str = Field(min_length=1, pattern=r"^https?://")
    # Names of where secrets live; the secrets themselves never belong in the policy.
    bearer_token_file: str | None = None
    bearer_token_env: str | None = None
    ca_file: str | None = None
    verify_tls: bool = True
    # The most one request may take, connecting and reading the whole answer included.
    timeout: Duration = 5
    retries: int = Field(default=2, ge=0, le=10)
    # The most the whole telemetry read of one cycle may take (every query, retry and backoff): a tenth
    # of the default 5m cycle interval. Past it the cycle has no telemetry, never part of it.
    deadline: Duration = Field(default=30, gt=0)

    @model_validator(mode="after")
    def _credentials_need_https(self) -> PrometheusConfig:
        """A bearer token or a URL's `user:password@` sent over plain http is readable on the wire."""
        refuse_secrets_over_plain_http(
            self.url,
            {"bearer_token_file": self.bearer_token_file, "bearer_token_env": self.bearer_token_env},
            "credentials are configured",
        )
        return self


def prometheus_with_url(
    conn: PrometheusConfig | None, url: str | None, command: str | None = None
) -> PrometheusConfig | None:
    """`conn` with its URL replaced by `url` (a command line's `--prometheus-url`), keeping the rest of
    the connection settings; `conn` itself when no URL is given. A URL the connection refuses (not
    http(s), or plain http:// with the policy's credentials) is an InputError naming `command` (when
    given) and the flag, the URL shown without its credentials (pydantic's own message would quote them)."""
    if url is None:
        return conn
    base = conn.model_dump() if conn is not None else {}
    try:
        return PrometheusConfig.model_validate({**base, "url": url})
    except ValidationError as exc:
        error = exc.errors()[0]
        detail = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "string_pattern_mismatch":
            detail = "expected an http(s):// URL"
        where = f"{command}: --prometheus-url" if command else "--prometheus-url"
        raise InputError([f"{where}: {detail} (got {quoted(redact_url(url))})"]) from None


class TelemetryConfig(StrictModel):
    preset: TelemetryPreset = "dcgm-exporter"
    utilization: MetricConfig = MetricConfig(name="DCGM_FI_DEV_GPU_UTIL")
    fb_used: MetricConfig = MetricConfig(name="DCGM_FI_DEV_FB_USED")
    fb_free: MetricConfig = MetricConfig(name="DCGM_FI_DEV_FB_FREE")
    labels: LabelMapping = LabelMapping()
    # Newest sample older than this (relative to `now`) makes a series stale.
    max_age: Duration = 300
    # The shortest interval Prometheus scrapes the exporter at: a series holds at most window /
    # scrape_interval samples (plus alignment slack), so a larger count is a bad answer, not evidence.
    # Default 15s: the interval of dcgm-exporter's Helm chart ServiceMonitor, the shortest in common use
    # (the exporter itself collects every 30s, --collect-interval 30000 ms; Prometheus' global default
    # scrape_interval is 1m). A longer real interval only loosens the bound; set it when yours is shorter.
    scrape_interval: Duration = Field(default=15, gt=0)
    prometheus: PrometheusConfig | None = None
