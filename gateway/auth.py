"""Who may use the gateway: API keys, their per-key policy, and the operators' admin token.

Keys come from a YAML file (``SPECGATE_KEYS_FILE``, e.g. a mounted Kubernetes Secret) or from the
``SPECGATE_KEYS`` variable holding the same YAML (an env file, a Secret's ``secretKeyRef``)::

    keys:
      - name: batch-jobs                # unique; shown in logs, metrics and 429 messages (never the key)
        sha256: 9f86d0...               # the key's SHA-256 in hex ... or `key: sk-...` (hashed at load)
        rpm: 600                        # requests per minute      (each limit optional)
        tpm: 200000                     # tokens per minute (prompt estimate + max_tokens, corrected by usage)
        concurrency: 32                 # requests in flight
        max_tokens: 4096                # a larger max_tokens is refused (400); none given: this one is sent
        pools: [standard]               # allowed pools; a decision for another goes to an allowed one
        steering: true                  # may send x-specgate-* headers (pin a pool, SLO, objective)

A presented key (``Authorization: Bearer``, ``api-key`` or ``x-api-key``) is hashed once (SHA-256) and
looked up in a dict keyed by the hashes; the match is confirmed with :func:`hmac.compare_digest`. Keys are
kept only as hashes and never logged. With no keys configured the gateway is open (and says so at start).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import orjson
import yaml
from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from gateway.bounds import length_bound
from gateway.config import Settings
from gateway.decide import Decision
from gateway.errors import AuthenticationError, InvalidRequest, RateLimited
from gateway.limits import Admission, KeyLimits, Limiter
from gateway.metrics import ANONYMOUS_KEY, GatewayMetrics, KeyMetrics
from gateway.rules import format_validation_error
from gateway.snapshot import Snapshot

log = logging.getLogger("specgate.auth")
KEY_HEADERS = ("authorization", "api-key", "x-api-key")  # also never forwarded to a pool
STEERING_PREFIX = "x-specgate-"  # x-specgate-pool, -slo-ttft-ms, -slo-e2e-ms, -objective, and any later one
PoolName = Literal["standard", "speculative"]


class KeysError(Exception):
    """A keys file or variable that does not validate; ``problems`` name each bad key's path."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


class KeyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")
    key: SecretStr | None = None
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")
    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)
    concurrency: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    pools: tuple[PoolName, ...] | None = Field(default=None, min_length=1)
    steering: bool = False

    @model_validator(mode="after")
    def _one_secret(self) -> KeyConfig:
        if (self.key is None) == (self.sha256 is None):
            raise ValueError("give exactly one of 'key' and 'sha256'")
        return self

    def digest(self) -> bytes:
        if self.key is not None:
            return hashlib.sha256(self.key.get_secret_value().encode()).digest()
        assert self.sha256 is not None
        return bytes.fromhex(self.sha256)


class KeysConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: tuple[KeyConfig, ...] = ()

    @field_validator("keys")
    @classmethod
    def _unique(cls, keys: tuple[KeyConfig, ...]) -> tuple[KeyConfig, ...]:
        names = [k.name for k in keys]
        if len(set(names)) != len(names):
            raise ValueError("key names must be unique")
        if len({k.digest() for k in keys}) != len(keys):
            raise ValueError("two entries hold the same key")
        return keys


def parse_keys(text: str, source: str) -> KeysConfig:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KeysError(source, [f"invalid YAML at {getattr(exc, 'problem_mark', '?')}"]) from None
    try:
        return KeysConfig.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise KeysError(source, format_validation_error(exc)) from None  # messages only: never the input


def read_keys(settings: Settings) -> KeysConfig:
    """The keys file and the keys variable, together (names must stay unique across both)."""
    keys: list[KeyConfig] = []
    if settings.keys_file is not None:
        try:
            text = Path(settings.keys_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise KeysError(str(settings.keys_file), [f"cannot read: {exc.strerror or exc}"]) from None
        keys += parse_keys(text, str(settings.keys_file)).keys
    if settings.keys is not None:
        keys += parse_keys(settings.keys.get_secret_value(), "SPECGATE_KEYS").keys
    try:
        return KeysConfig(keys=tuple(keys))
    except ValidationError as exc:
        raise KeysError("keys", format_validation_error(exc)) from None


def presented_key(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization")
    if auth is not None:
        scheme, _, token = auth.strip().partition(" ")
        return token.strip() or None if scheme.lower() == "bearer" else None
    return headers.get("api-key") or headers.get("x-api-key") or None


@dataclass(eq=False, slots=True)
class ApiKey:
    name: str
    digest: bytes
    max_tokens: int | None
    pools: frozenset[str] | None
    steering: bool
    limits: KeyLimits | None  # None: no rpm, tpm or concurrency limit
    stats: KeyMetrics  # specgate_key_* labelled by ``name``

    def cap(self, payload: dict[str, Any], body: bytes, field: str = "max_tokens") -> bytes:
        """The key's ``max_tokens`` cap, per completion: a body whose length bound (the largest of every spelling
        present, :func:`gateway.bounds.length_bound`) is over it is refused (400); a value that is not a positive
        JSON integer is refused whatever the cap; with none given the cap is sent as ``field``."""
        cap = self.max_tokens
        if cap is None:
            return body
        bound = length_bound(payload)
        if bound is None:
            payload[field] = cap
            return orjson.dumps(payload)
        name, value = bound
        if value > cap:
            raise InvalidRequest(f"'{name}' is {value}; this key allows at most {cap}", param=name)
        return body

    def steer(self, decision: Decision, snapshot: Snapshot) -> Decision:
        """A decision for a pool this key may not use goes to an allowed one (the available one first)."""
        allowed = self.pools
        if allowed is None or decision.pool in allowed:
            return decision
        choices = sorted(allowed, key=lambda name: not snapshot.pool(name).available)
        note = f"{decision.reason}; key: {decision.pool} not allowed"
        return replace(decision, pool=choices[0], reason=note)


class Access:
    """The keys in force, their limits, and the admin token. ``authenticate`` is on the request path."""

    def __init__(self, settings: Settings, limiter: Limiter, metrics: GatewayMetrics) -> None:
        self.settings = settings
        self.limiter = limiter
        self.metrics = metrics
        self.anonymous = metrics.key_metrics(ANONYMOUS_KEY)  # requests while no keys are configured (exported then)
        self.keys: dict[bytes, ApiKey] = {}
        self._stats: dict[str, KeyMetrics] = {}
        token = settings.admin_token
        self._admin = hashlib.sha256(token.get_secret_value().encode()).digest() if token is not None else None
        self.load(read_keys(settings))

    @property
    def open(self) -> bool:
        return not self.keys

    def load(self, config: KeysConfig) -> None:
        """Swap in a new key set; limits of keys kept by name keep their state."""
        limits = self.limiter.configure((k.name, k.rpm, k.tpm, k.concurrency) for k in config.keys)
        stats = {k.name: self.metrics.key_metrics(k.name) for k in config.keys}
        keys = {}
        for k in config.keys:
            limited = k.rpm is not None or k.tpm is not None or k.concurrency is not None
            pools = frozenset(k.pools) if k.pools is not None else None
            key_limits = limits[k.name] if limited else None
            keys[k.digest()] = ApiKey(k.name, k.digest(), k.max_tokens, pools, k.steering, key_limits, stats[k.name])
        self.keys = keys
        for gone in self._stats.keys() - stats.keys():
            self.metrics.forget_key(gone)
        self._stats = stats
        if keys:
            self.metrics.forget_key(ANONYMOUS_KEY)
        else:
            self.anonymous = self.metrics.key_metrics(ANONYMOUS_KEY)

    def reload(self) -> int:
        """Re-read the keys (``POST /admin/reload``); an invalid source raises :class:`KeysError`, old keys stay."""
        self.load(read_keys(self.settings))
        if self.open:
            log.warning("no API keys after the reload: the gateway is open to anyone who can reach it")
        return len(self.keys)

    def announce(self) -> None:
        """Once at start: say how the gateway is guarded (never which keys)."""
        if self.open:
            log.warning("no API keys configured: the gateway is open to anyone who can reach it")
        else:
            log.info("%d API key(s) configured", len(self.keys))
        if self._admin is None and not self.open:
            log.warning("no admin token configured: operator endpoints are closed while API keys are set")

    def authenticate(self, headers: MutableMapping[str, str]) -> ApiKey | None:
        """The caller's key (None when the gateway is open); strips steering headers the key may not send."""
        keys = self.keys
        if not keys:
            return None
        presented = presented_key(headers)
        if presented is None:
            raise AuthenticationError("You didn't provide an API key (Authorization: Bearer <key>).")
        digest = hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest()
        key = keys.get(digest)
        if key is None or not hmac.compare_digest(key.digest, digest):
            raise AuthenticationError("Incorrect API key provided.")
        if not key.steering:
            for name in [n for n in headers if n.startswith(STEERING_PREFIX)]:
                del headers[name]
        return key

    def check(self, key: ApiKey, now: float) -> None:
        """Refuse (429) a key that could not be admitted for any request now, before its body is parsed."""
        if key.limits is None:
            return
        try:
            key.limits.check(now)
        except RateLimited as exc:
            key.stats.refused(exc.limit)
            raise

    def admit(self, key: ApiKey, prompt_tokens: int, completion_tokens: int, now: float) -> Admission | None:
        if key.limits is None:
            return None
        try:
            return key.limits.admit(prompt_tokens + completion_tokens, now)
        except RateLimited as exc:
            key.stats.refused(exc.limit)
            raise

    def finish(self, key: ApiKey | None, admission: Admission | None, status: int, used_tokens: int) -> None:
        """A routed request ended: its admission (slot, unused tokens) back, once; its key's counters."""
        if admission is not None:
            admission.finish(used_tokens)
        (key.stats if key is not None else self.anonymous).finished(status, used_tokens)

    def check_admin(self, headers: Mapping[str, str]) -> None:
        """Raise 401 unless the admin token is presented. No token set: open while no API keys are set."""
        if self._admin is None:
            if self.open:
                return
            raise AuthenticationError("Operator endpoints need the admin token, and none is configured.")
        presented = presented_key(headers)
        digest = hashlib.sha256((presented or "").encode("utf-8", "surrogateescape")).digest()
        if presented is None or not hmac.compare_digest(self._admin, digest):
            raise AuthenticationError("This endpoint needs the admin token.")


def require_key(request: Request) -> None:
    """FastAPI dependency for what any API key may read (``/v1/models``): 401 without one once keys are set."""
    request.app.state.gateway.access.authenticate(dict(request.headers))


def require_admin(request: Request) -> None:
    """FastAPI dependency for operator endpoints: ``dependencies=[Depends(require_admin)]``."""
    request.app.state.gateway.access.check_admin(request.headers)


def upstream_headers(settings: Settings) -> dict[str, dict[str, str]]:
    """Per pool, the ``Authorization`` the gateway sends its replicas (vLLM ``--api-key``), if any."""
    keys = {"standard": settings.standard_api_key, "speculative": settings.speculative_api_key}
    return {pool: {"authorization": f"Bearer {k.get_secret_value()}"} for pool, k in keys.items() if k is not None}
