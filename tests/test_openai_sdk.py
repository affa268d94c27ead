"""The official openai SDK pointed at the gateway."""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest

from tests.conftest import Gateway


def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="not-needed", max_retries=0)


def test_openai_sdk_non_streaming(gateway: Callable[..., Gateway]) -> None:
    sdk = client(gateway())
    raw = sdk.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "Summarize: the cat sat on the mat."}], max_tokens=60
    )
    completion = raw.parse()
    assert raw.headers["x-specgate-pool"] == "speculative"
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens == 60


def test_openai_sdk_streaming(gateway: Callable[..., Gateway]) -> None:
    sdk = client(gateway())
    stream = sdk.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text.split() == [f"t{i}" for i in range(12)]


def test_openai_sdk_completions_and_models(gateway: Callable[..., Gateway]) -> None:
    sdk = client(gateway())
    assert [m.id for m in sdk.models.list()] == ["fake-model"]
    completion = sdk.completions.create(model="fake-model", prompt="Translate to German: good morning", max_tokens=5)
    assert completion.choices[0].text


def test_openai_sdk_sees_gateway_errors(gateway: Callable[..., Gateway]) -> None:
    sdk = client(gateway())
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(model="fake-model", messages=[])
