"""Property tests of body parsing and feature extraction: any input gives features or an OpenAI-shaped 4xx.

Seeded (``derandomize``): every CI run checks the same examples, and a failure reproduces.
"""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidRequest
from gateway.features import Classifier, RequestFeatures, extract_features
from gateway.proxy import parse_json_object
from gateway.rules import default_rules
from tests.fuzz.cases import CHAT, RAN, mutated_body
from tests.fuzz.strategies import any_json, bodies

RULES = default_rules()
CLASSIFIER = Classifier(RULES)
TASKS = {*RULES.task_names(), RULES.defaults.task}
FUZZ = dict(derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_openai_error(exc: InvalidRequest) -> None:
    assert 400 <= exc.status_code < 500
    error = orjson.loads(exc.to_json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == "invalid_request_error"


def route(body: bytes, kind: str) -> RequestFeatures | InvalidRequest:
    """What the proxy does with a body before routing: parse, then extract; only InvalidRequest may escape."""
    RAN[__name__] += 1
    try:
        return extract_features(parse_json_object(body), kind, {}, RULES, CLASSIFIER)
    except InvalidRequest as exc:
        assert_openai_error(exc)
        return exc


def check_features(features: RequestFeatures) -> None:
    assert isinstance(features.model, str)
    assert isinstance(features.max_tokens, int) and features.max_tokens >= 1
    assert isinstance(features.n, int) and features.n >= 1
    assert isinstance(features.prompt_tokens, int) and features.prompt_tokens >= 0
    assert isinstance(features.stream, bool)
    assert features.temperature is None or features.temperature >= 0
    assert features.task in TASKS


@settings(max_examples=300, **FUZZ)  # type: ignore[arg-type]
@given(body=bodies, kind=st.sampled_from(["chat", "completions"]))
def test_any_json_body_gives_features_or_invalid_request(body: Any, kind: str) -> None:
    outcome = route(json.dumps(body).encode(), kind)  # json, not orjson: integers past 64 bits too
    if isinstance(outcome, RequestFeatures):
        check_features(outcome)


@settings(max_examples=400, **FUZZ)  # type: ignore[arg-type]
@given(body=st.binary(max_size=300) | any_json.map(lambda v: orjson.dumps(v)[:-1]))
def test_any_bytes_parse_to_an_object_or_malformed_json(body: bytes) -> None:
    route(body, "chat")


@settings(max_examples=150, **FUZZ)  # type: ignore[arg-type]
@given(
    big=st.integers(min_value=2**64, max_value=2**2000) | st.integers(min_value=-(2**2000), max_value=-(2**64)),
    key=st.sampled_from(["max_tokens", "max_completion_tokens", "n", "temperature", "model", "messages", "prompt"]),
    kind=st.sampled_from(["chat", "completions"]),
)
def test_integers_beyond_64_bits_in_any_field(big: int, key: str, kind: str) -> None:
    """orjson reads such integers as floats, but another parser (or a caller of extract_features) may not."""
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    RAN[__name__] += 1
    try:
        check_features(extract_features({**body, key: big}, kind, {}, RULES, CLASSIFIER))
    except InvalidRequest as exc:
        assert_openai_error(exc)


MUTATED = 5000


def test_mutated_bodies_give_features_or_invalid_request() -> None:
    """Seeded mutation fuzzing in-process (cheap, so many cases): valid bodies truncated, spliced, flipped."""
    rng = random.Random(20261201)
    outcomes = [route(body, "chat" if path == CHAT else "completions") for path, body in
                (mutated_body(rng) for _ in range(MUTATED))]  # fmt: skip
    for outcome in outcomes:
        if isinstance(outcome, RequestFeatures):
            check_features(outcome)
    refused = sum(isinstance(o, InvalidRequest) for o in outcomes)
    assert 0.3 * MUTATED < refused < MUTATED  # the mutations reach both outcomes
