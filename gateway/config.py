"""Process settings: environment variables (prefix ``SPECGATE_``), a ``.env`` file, or CLI flags."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gateway.signals import DEFAULT_QPS_QUERY

UrlList = Annotated[list[str], NoDecode]
# Variables of the project's own scripts (scripts/test, scripts/setup/*), not gateway settings.
SCRIPT_VARIABLES = frozenset({"SPECGATE_VENV", "SPECGATE_CACHE"})


class Settings(BaseSettings):
    """Unknown ``SPECGATE_*`` variables and unknown keyword arguments are errors that name the key; other
    entries of a shared ``.env`` (``HF_TOKEN`` for docker compose, say) are left alone."""

    model_config = SettingsConfigDict(env_prefix="SPECGATE_", env_file=".env", extra="ignore")

    def __init__(self, **values: Any) -> None:
        unknown = sorted(k for k in values if not k.startswith("_") and k not in type(self).model_fields)
        if unknown:
            raise ValueError(f"unknown setting(s): {', '.join(unknown)}")
        super().__init__(**values)

    rules_file: Path | None = None  # None: the shipped gateway/rules.yaml
    standard_urls: UrlList = Field(default_factory=list)  # override the rules file's replicas
    speculative_urls: UrlList = Field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)

    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    client_max_head_bytes: int = Field(default=64 * 1024, ge=1024)  # request line + headers; past it: 431
    client_read_timeout_s: float = Field(default=60.0, gt=0)  # connection open/first byte to last body byte: 408
    connect_timeout_s: float = Field(default=5.0, gt=0)
    first_byte_timeout_s: float = Field(default=600.0, gt=0)  # until the response headers / first stream chunk
    idle_timeout_s: float = Field(default=120.0, gt=0)  # between two stream chunks
    # Ask the pool for usage on every stream (stream_options.include_usage) and strip it where the client did not
    # ask (gateway/stream_usage.py): every finished stream teaches exact tokens and acceptance. Off: forward as sent.
    stream_usage: bool = True
    upstream_client: Literal["auto", "raw", "aiohttp", "httpx", "httpx-aiohttp"] = "auto"
    max_connections: int = Field(default=0, ge=0)  # per upstream host; 0 = no limit

    # Circuit breaking per replica from real traffic (gateway/breaker.py); breaker_failures=0 turns it off.
    breaker_failures: int = Field(default=5, ge=0)  # consecutive failures that open a replica's breaker
    breaker_error_rate: float = Field(default=0.5, gt=0, le=1)  # or this failure ratio over the window
    breaker_min_requests: int = Field(default=20, ge=1)  # outcomes in the window before the ratio counts
    breaker_window_s: float = Field(default=10.0, gt=0)
    breaker_cooldown_s: float = Field(default=5.0, gt=0)  # open this long, then one half-open probe
    # Graceful shutdown on SIGTERM (gateway/shutdown.py): /ready turns 503 at once; after drain_delay_s the
    # listener closes; in-flight requests get shutdown_grace_s to finish; then the process exits 0.
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    drain_delay_s: float = Field(default=0.0, ge=0)  # keep accepting this long (0: a Helm preStop sleep does it)

    # The prefix index (gateway/prefix_index.py): a replica is chosen by where the prompt's prefix is likely cached.
    # auto: on when a pool has more than one replica; on: always (blocks and session keys read on every request).
    prefix_index: Literal["auto", "on", "off"] = "auto"
    prefix_index_blocks_per_replica: int = Field(default=2048, ge=16)  # 512-byte blocks (~128 tokens) remembered
    prefix_index_read_bytes: int = Field(default=16 * 1024, ge=256, le=1024 * 1024)  # text hashed per request

    health_interval_s: float = Field(default=2.0, gt=0)
    health_timeout_s: float = Field(default=2.0, gt=0)
    snapshot_interval_s: float = Field(default=0.25, gt=0)
    # `specgate serve` only (gateway/collector.py): freeze what the cyclic collector would rescan every this
    # many seconds (0: freeze start-up only); a full pass when the frozen objects grew this many times over.
    gc_freeze_interval_s: float = Field(default=0.25, ge=0)
    gc_full_growth: float = Field(default=1.0, gt=0)
    gc_young_threshold: int = Field(default=10_000, ge=0)  # allocations between young passes (0: CPython's 700)
    # Finished requests learned from (gateway/adaptive), at most, per second: past it, the first of each
    # snapshot refresh. The model forgets ~5 % per sample, so more would replace, not add, what it knows.
    learn_max_per_s: float = Field(default=400.0, gt=0)
    qps_window_s: float = Field(default=10.0, gt=0)
    reload_rules: bool = True
    reload_keys: bool = True  # watch keys_file as the rules file is watched
    # Endpoints without a routing decision (gateway/passthrough.py): this pool first (unset: the rules' default).
    passthrough_pool: Literal["standard", "speculative"] | None = None
    responses_ttl_s: float = Field(default=3600.0, gt=0)  # how long a response id maps back to its replica
    responses_max_ids: int = Field(default=100_000, ge=1)  # ids in memory (full: the biggest holder's oldest go)
    log_level: str = "info"
    log_format: Literal["text", "json"] = "text"  # json: JSON lines, one per finished request (gateway/logs.py)
    tracing: Literal["off", "otel"] = "off"  # otel: OpenTelemetry spans, OTEL_* variables (gateway/tracing.py)

    # Live signals (gateway/signals): vLLM /metrics scrapes, Prometheus queries, state shared through Redis.
    engine_metrics_interval_s: float = Field(default=1.0, gt=0)
    engine_metrics_timeout_s: float = Field(default=0.5, gt=0)
    engine_stale_after_s: float = Field(default=3.0, gt=0)  # a replica's stats older than this are unused
    acceptance_window_s: float = Field(default=30.0, gt=0)
    prometheus_url: str | None = None  # unset: QPS from Redis's shared window, or the local one
    prometheus_qps_query: str = DEFAULT_QPS_QUERY
    prometheus_signals: dict[str, str] = Field(default_factory=dict)  # name -> PromQL; JSON in the env var
    prometheus_interval_s: float = Field(default=1.0, gt=0)
    prometheus_timeout_s: float = Field(default=1.0, gt=0)
    prometheus_stale_after_s: float = Field(default=5.0, gt=0)
    prometheus_warmup_s: float = Field(default=30.0, ge=0)  # = the QPS query's range: see docs/signals.md
    redis_url: str | None = None  # unset: in-memory state, nothing shared between replicas
    redis_timeout_s: float = Field(default=0.25, gt=0)
    redis_sync_interval_s: float = Field(default=0.25, gt=0)
    redis_stale_after_s: float = Field(default=2.0, gt=0)
    # The learned latency model (gateway/adaptive): shared through Redis when redis_url is set.
    model_sync_interval_s: float = Field(default=2.0, gt=0)
    model_ttl_s: float = Field(default=60.0, gt=0)  # a replica's shared numbers expire this long after its last sync

    # Who may use it (gateway/auth.py, docs/operating.md). No keys: the gateway is open.
    keys_file: Path | None = None  # YAML with `keys:` (a mounted Secret)
    keys: SecretStr | None = None  # the same YAML in a variable (an env file, a Secret's secretKeyRef)
    admin_token: SecretStr | None = None  # for /v1/route/explain, /admin/reload (and /metrics, see below)
    metrics_need_admin: bool = False
    standard_api_key: SecretStr | None = None  # sent as `Authorization: Bearer` to the pool's replicas
    speculative_api_key: SecretStr | None = None

    @model_validator(mode="after")
    def _no_unknown_environment(self) -> Settings:
        prefix = "SPECGATE_"
        unknown = sorted(
            key
            for key in os.environ
            if key.startswith(prefix)
            and key not in SCRIPT_VARIABLES
            and key[len(prefix) :].lower() not in type(self).model_fields
        )
        if unknown:
            raise ValueError(f"unknown environment variable(s): {', '.join(unknown)}")
        return self

    @field_validator("standard_urls", "speculative_urls", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip().rstrip("/") for part in value.split(",") if part.strip()]
        return value
