"""The routing rules file: typed, validated, and loaded with errors that name the bad key.

A rules file holds the pools' replicas, the task cues the classifier uses, and an ordered list of rules
(first match wins). Everything here is pure data; :mod:`gateway.decide` evaluates it.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Sequence
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway.errors import RulesError

PoolName = Literal["standard", "speculative"]
PoolTarget = Literal["standard", "speculative", "fastest"]  # fastest: the pool the learned model predicts faster
Objective = Literal["e2e", "ttft"]
Scalar = float | int | bool | str

_RULE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Comparison(_Strict):
    """One comparison on a value. A bare scalar means ``eq``, a bare list means ``in``.

    A value that is unknown (a pool never scraped, a missing header) matches nothing.
    """

    lt: float | None = None
    le: float | None = None
    gt: float | None = None
    ge: float | None = None
    eq: Scalar | None = None
    ne: Scalar | None = None
    in_: tuple[Scalar, ...] | None = Field(default=None, alias="in")
    not_in: tuple[Scalar, ...] | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return {"in": list(value)}
        if isinstance(value, float | int | bool | str):
            return {"eq": value}
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> Comparison:
        if not self.model_fields_set:
            raise ValueError("a comparison needs at least one of lt, le, gt, ge, eq, ne, in, not_in")
        return self

    @cached_property
    def predicate(self) -> Callable[[Any], bool]:
        """The comparison compiled once into a closure (a cached property: not a field, not compared)."""
        return _compile_comparison(self)

    def matches(self, value: Scalar | None) -> bool:
        return self.predicate(value)


def _compile_comparison(cmp: Comparison) -> Callable[[Any], bool]:
    """One closure per comparison, testing only the operators it sets (the decider runs these per request)."""
    tests: list[Callable[[Any], bool]] = []
    if cmp.in_ is not None:
        allowed = frozenset(cmp.in_)
        tests.append(lambda v: v in allowed)
    if cmp.not_in is not None:
        banned = frozenset(cmp.not_in)
        tests.append(lambda v: v not in banned)
    if cmp.eq is not None:
        equal = cmp.eq
        tests.append(lambda v: v == equal)
    if cmp.ne is not None:
        unequal = cmp.ne
        tests.append(lambda v: v != unequal)
    bounds = [(op, b) for op, b in ((operator.lt, cmp.lt), (operator.le, cmp.le), (operator.gt, cmp.gt),
                                    (operator.ge, cmp.ge)) if b is not None]  # fmt: skip
    if bounds:
        tests.append(lambda v: not isinstance(v, str) and all(op(v, b) for op, b in bounds))
    if len(tests) == 1:
        only = tests[0]
        return lambda v: v is not None and only(v)
    return lambda v: v is not None and all(test(v) for test in tests)


# (source, key, field, test): source is "request" (a RequestFeatures attribute), "qps", "header",
# "signal" or "pool" (key = pool name, field = a PoolSnapshot attribute).
Check = tuple[str, str, str, Callable[[Any], bool]]
REQUEST_FIELDS = ("max_tokens", "prompt_tokens", "task", "model", "n", "temperature")
POOL_FIELDS = ("healthy_replicas", "running", "waiting", "kv_cache_usage", "acceptance_rate", "acceptance_length")


class PoolCondition(_Strict):
    """Conditions on one pool's live state (see :class:`gateway.snapshot.PoolSnapshot`)."""

    healthy_replicas: Comparison | None = None
    running: Comparison | None = None
    waiting: Comparison | None = None
    kv_cache_usage: Comparison | None = None
    acceptance_rate: Comparison | None = None
    acceptance_length: Comparison | None = None


class When(_Strict):
    """All present conditions must hold (AND). An empty ``when`` always matches."""

    max_tokens: Comparison | None = None
    prompt_tokens: Comparison | None = None
    task: Comparison | None = None
    model: Comparison | None = None
    stream: bool | None = None
    n: Comparison | None = None
    temperature: Comparison | None = None
    qps: Comparison | None = None
    headers: dict[str, Comparison] = Field(default_factory=dict)
    pools: dict[PoolName, PoolCondition] = Field(default_factory=dict)
    signals: dict[str, Comparison] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _lowercase_headers(cls, value: dict[str, Comparison]) -> dict[str, Comparison]:
        return {name.lower(): cmp for name, cmp in value.items()}

    @cached_property
    def checks(self) -> tuple[Check, ...]:
        """The conditions present, as ``(source, key, field, test)``; the decider reads the value and tests it.
        Built once per rules object (a cached property: not a field, not compared)."""
        checks: list[Check] = []
        for name in REQUEST_FIELDS:
            cmp = getattr(self, name)
            if cmp is not None:
                checks.append(("request", name, "", cmp.predicate))
        if self.stream is not None:
            wanted = self.stream
            checks.append(("request", "stream", "", lambda v: v is wanted))
        if self.qps is not None:
            checks.append(("qps", "", "", self.qps.predicate))
        checks.extend(("header", name, "", cmp.predicate) for name, cmp in self.headers.items())
        checks.extend(("signal", name, "", cmp.predicate) for name, cmp in self.signals.items())
        for pool, condition in self.pools.items():
            for field in POOL_FIELDS:
                cmp = getattr(condition, field)
                if cmp is not None:
                    checks.append(("pool", pool, field, cmp.predicate))
        return tuple(checks)


class Rule(_Strict):
    name: str = Field(pattern=_RULE_NAME, max_length=64)
    description: str = ""
    when: When = Field(default_factory=When)
    pool: PoolTarget


class TaskCues(_Strict):
    """Cues for one task type. ``keywords`` match case-insensitively as substrings; ``patterns`` are regexes."""

    keywords: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for index, pattern in enumerate(value):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"pattern {index} does not compile: {exc}") from exc
        return value


class PoolConfig(_Strict):
    replicas: tuple[str, ...] = ()

    @field_validator("replicas")
    @classmethod
    def _urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if not re.match(r"^https?://[^/\s]+", url):
                raise ValueError(f"replica {url!r} is not an http(s) URL")
        return tuple(url.rstrip("/") for url in value)


class Defaults(_Strict):
    max_tokens: int = Field(default=256, ge=1)
    task: str = "chat"
    classify_chars: int = Field(default=4000, ge=100)


class AdaptiveConfig(_Strict):
    """How the ``fastest`` target learns and chooses (see gateway/adaptive/ and docs/adaptive.md)."""

    min_samples: int = Field(default=5, ge=1, description="finished requests per pool before `fastest` decides")
    min_cell_samples: float = Field(default=3.0, ge=0, description="below this a prediction counts as uncertain")
    explore_share: float = Field(default=0.02, ge=0, le=0.2, description="most requests sent to the other pool")
    stale_s: float = Field(
        default=120.0, gt=0,
        description="a pool, or a request's segment on a pool, unobserved this long is explored (and what the "
        "model knows of an unseen segment there fades on this scale)",
    )  # fmt: skip
    learning_rate: float = Field(default=0.05, gt=0, le=1, description="forgetting: the smallest step of a cell")
    split_temperature: float = Field(
        default=0.05, gt=0, le=1,
        description="softness of the split near balance, times the share of the pools' requests other gateways sent",
    )  # fmt: skip
    externality: float = Field(default=1.0, ge=0, le=4, description="weight of the delay a request adds to others")
    shared_device: bool = Field(
        default=False,
        description="the two pools run on one device (time-sliced): the model starts from each pool running at half "
        "speed while the other works and learns the factor from there, instead of learning whether they couple "
        "(which needs each pool idle some of the time; docs/adaptive.md)",
    )  # fmt: skip
    warmup_pool: PoolName = Field(default="standard", description="`default_pool: fastest` while warming up")
    warmup_balance: bool = Field(
        default=True,
        description="while warming up, a request the rules send to the pool with more requests on it goes to the "
        "other (the shorter queue); the rules choose between equally loaded pools",
    )  # fmt: skip


class ResumeConfig(_Strict):
    """Resuming a stream cut mid-answer on another replica (see gateway/resume.py, docs/operating.md). Off by
    default: the continuation is the model's, not the dead replica's (identical only for greedy decoding)."""

    streams: bool = Field(default=False, description="resume eligible chat streams cut after their first byte")
    max_attempts: int = Field(default=1, ge=1, le=3, description="continuations tried per stream, one replica each")


class RoutingRules(_Strict):
    version: Literal[1] = 1
    pools: dict[PoolName, PoolConfig] = Field(default_factory=dict)
    models: tuple[str, ...] = ()
    defaults: Defaults = Field(default_factory=Defaults)
    tasks: dict[str, TaskCues] = Field(default_factory=dict)
    rules: tuple[Rule, ...] = ()
    default_pool: PoolTarget = "standard"
    objective: Objective = "e2e"  # what `fastest` minimises: end-to-end latency or time to first token
    adaptive: AdaptiveConfig = Field(default_factory=AdaptiveConfig)
    resume: ResumeConfig = Field(default_factory=ResumeConfig)

    @cached_property
    def uses_fastest(self) -> bool:
        """Whether any rule (or the default) routes by the learned model: only then does the gateway learn."""
        return self.default_pool == "fastest" or any(rule.pool == "fastest" for rule in self.rules)

    @model_validator(mode="after")
    def _consistent(self) -> RoutingRules:
        names = [rule.name for rule in self.rules]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"rule names must be unique; repeated: {', '.join(duplicates)}")
        known = set(self.tasks) | {self.defaults.task}
        for index, rule in enumerate(self.rules):
            for task in _task_values(rule.when.task):
                if task not in known:
                    raise ValueError(
                        f"rules.{index}.when.task: unknown task {task!r} (known: {', '.join(sorted(known))})"
                    )
        return self

    def task_names(self) -> list[str]:
        return [*self.tasks, self.defaults.task]

    def with_replicas(self, standard: Sequence[str], speculative: Sequence[str]) -> RoutingRules:
        """The same rules with the given replicas in place of the file's (empty lists keep the file's)."""
        pools = dict(self.pools)
        for name, urls in (("standard", standard), ("speculative", speculative)):
            if urls:
                pools[name] = PoolConfig(replicas=tuple(urls))  # type: ignore[index]
        return self.model_copy(update={"pools": pools})


def _task_values(cmp: Comparison | None) -> Iterable[Scalar]:
    if cmp is None:
        return ()
    values: list[Scalar] = []
    for group in (cmp.in_, cmp.not_in):
        values.extend(group or ())
    values.extend(v for v in (cmp.eq, cmp.ne) if v is not None)
    return [v for v in values if isinstance(v, str)]


def parse_rules(data: Any, source: str = "<rules>") -> RoutingRules:
    if not isinstance(data, dict):
        raise RulesError(source, ["(top level): expected a mapping"])
    try:
        return RoutingRules.model_validate(data)
    except ValidationError as exc:
        raise RulesError(source, format_validation_error(exc)) from exc


def load_rules(path: str | Path) -> RoutingRules:
    """Load and validate a rules file; raise :class:`RulesError` whose lines name each bad key's path."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise RulesError(source, [f"cannot read: {exc.strerror or exc}"]) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RulesError(source, [f"invalid YAML: {exc}"]) from exc
    return parse_rules(data, source)


def default_rules_path() -> Path:
    return Path(str(resources.files("gateway") / "rules.yaml"))


def default_rules() -> RoutingRules:
    """The shipped policy (gateway/rules.yaml): pins, then `fastest`, with the reference rules to warm up."""
    return load_rules(default_rules_path())


def reference_rules_path() -> Path:
    return Path(str(resources.files("gateway") / "rules-reference.yaml"))


def reference_rules() -> RoutingRules:
    """The static reference policy (gateway/rules-reference.yaml): the baseline every benchmark compares to."""
    return load_rules(reference_rules_path())


def format_validation_error(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        path = ".".join(str(part) for part in err["loc"] if not str(part).startswith("function-"))
        message = err["msg"].removeprefix("Value error, ")
        lines.append(f"{path or '(top level)'}: {message}")
    return lines
