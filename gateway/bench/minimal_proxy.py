"""The yardstick for gateway overhead: the smallest useful aiohttp reverse proxy (no routing, no metrics).

``python -m gateway.bench.minimal_proxy --port N --upstream URL``. It reads the body, forwards it with one
shared ClientSession and relays the response chunk by chunk, as any proxy must.
"""

from __future__ import annotations

import argparse

import aiohttp
import uvloop
from aiohttp import web

_HOP = frozenset({"host", "content-length", "connection", "transfer-encoding", "keep-alive"})


def build(upstream: str) -> web.Application:
    app = web.Application()
    session_key = web.AppKey("session", aiohttp.ClientSession)

    async def on_startup(app: web.Application) -> None:
        app[session_key] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
        )

    async def on_cleanup(app: web.Application) -> None:
        await app[session_key].close()

    async def proxy(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with app[session_key].post(upstream + request.path, data=body, headers=headers) as upstream_resp:
            out_headers = {k: v for k, v in upstream_resp.headers.items() if k.lower() not in _HOP}
            if not upstream_resp.content_type.startswith("text/event-stream"):
                return web.Response(status=upstream_resp.status, body=await upstream_resp.read(), headers=out_headers)
            response = web.StreamResponse(status=upstream_resp.status, headers=out_headers)
            await response.prepare(request)
            async for chunk in upstream_resp.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/v1/chat/completions", proxy)
    app.router.add_post("/v1/completions", proxy)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args(argv)
    uvloop.install()
    web.run_app(build(args.upstream.rstrip("/")), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
