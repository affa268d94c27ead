"""LiteLLM's SDK as a client of the gateway (model ``openai/<name>`` with ``api_base`` at the gateway)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import Gateway


@pytest.fixture
def sync_loop() -> Iterator[None]:
    """LiteLLM's sync calls take the thread's event loop for their logging hooks (``asyncio.get_event_loop()``,
    which makes one and never closes it); lend them one and close it afterwards."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield
    finally:
        asyncio.set_event_loop(None)
        loop.close()


@pytest.mark.usefixtures("sync_loop")
def test_litellm_completion_and_stream(gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the cost map from the network
    import litellm  # imported here, after the variable above is set

    gw = gateway()
    common = {"model": "openai/fake-model", "api_base": f"{gw.url}/v1", "api_key": "unused"}
    reply = litellm.completion(messages=[{"role": "user", "content": "Summarize: a b c"}], max_tokens=64, **common)
    assert reply.choices[0].message.content.split() == ["tok"] * 64
    headers = reply._hidden_params["additional_headers"]
    assert headers["llm_provider-x-specgate-pool"] == "speculative"
    stream = litellm.completion(messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True, **common)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream).split() == [f"t{i}" for i in range(6)]
