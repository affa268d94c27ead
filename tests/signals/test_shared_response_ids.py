"""Two gateway replicas sharing a real Redis: a response created through one is found through the other, on
the emulated replica (EMULATED) that created it."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.conftest import wait_for
from tests.emulated import EmulatedGateway, EmulatedPools, iter_pools
from tests.signals.servers import RedisServer

pytestmark = pytest.mark.redis


@pytest.fixture
def three_gateways(private_redis: RedisServer) -> Iterator[tuple[EmulatedPools, list[EmulatedGateway]]]:
    for pools, start in iter_pools():
        yield pools, [start(redis_url=private_redis.url), start(redis_url=private_redis.url), start()]


def test_gateway_b_finds_a_response_created_through_gateway_a(
    three_gateways: tuple[EmulatedPools, list[EmulatedGateway]],
) -> None:
    pools, (a, b, alone) = three_gateways
    sdk_a, sdk_b = a.client(), b.client()
    created = [sdk_a.responses.create(model=pools.model, input=f"Say hi {i}", max_output_tokens=20) for i in range(4)]
    for response in created:  # written before the body went out: found at once
        raw = sdk_b.responses.with_raw_response.retrieve(response.id)
        assert raw.parse().output_text == response.output_text
        assert raw.headers["x-specgate-reason"] == "response owner"
    streamed = list(sdk_a.responses.create(model=pools.model, input="Stream hi", max_output_tokens=20, stream=True))
    rid = streamed[0].response.id  # type: ignore[union-attr]

    def found() -> bool:
        try:
            return sdk_b.responses.retrieve(rid).id == rid
        except openai.NotFoundError:
            return False

    wait_for(found, 5.0, "the streamed response's id in Redis")  # written in the background as the stream began
    with pytest.raises(openai.NotFoundError):  # a gateway without Redis knows only what it relayed itself
        alone.client().responses.retrieve(created[0].id)
