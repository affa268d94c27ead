"""The upstream seam's default: the raw client for http:// replicas, aiohttp for https:// ones."""

from __future__ import annotations

import pytest

from gateway.config import Settings
from gateway.errors import UpstreamConnectError
from gateway.servers import free_port
from gateway.upstream import AutoUpstream, make_upstream


def test_auto_is_the_default() -> None:
    assert isinstance(make_upstream(Settings(_env_file=None)), AutoUpstream)  # type: ignore[call-arg]


async def test_auto_sends_http_to_the_raw_client_and_https_to_aiohttp() -> None:
    upstream = AutoUpstream(Settings(_env_file=None, connect_timeout_s=2))  # type: ignore[call-arg]
    await upstream.start()
    try:
        port = free_port()
        with pytest.raises(UpstreamConnectError) as plain:
            await upstream.send(f"http://127.0.0.1:{port}/v1/completions", b"{}", {})
        with pytest.raises(UpstreamConnectError) as tls:
            await upstream.send(f"https://127.0.0.1:{port}/v1/completions", b"{}", {})
    finally:
        await upstream.close()
    assert plain.value.__cause__ is not None and type(plain.value.__cause__).__module__ != "aiohttp.client_exceptions"
    assert type(tls.value.__cause__).__module__.startswith("aiohttp")
