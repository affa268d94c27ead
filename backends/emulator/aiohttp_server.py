"""The same emulator served by aiohttp.web instead of raw ASGI (``specgate emulate --server aiohttp``).

Kept so that the concurrency benchmark can compare the two transports on the same core; the routes, bodies,
headers and errors are the ones of :mod:`.server`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from backends.emulator import extras
from backends.emulator import openai_io as io
from backends.emulator import responses_io as rio
from backends.emulator.core import EmulatorCore, full_body, stream_events

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_aiohttp_app(core: EmulatorCore) -> web.Application:
    app = web.Application(middlewares=[_errors_with_headers(core)])
    app.router.add_post("/v1/chat/completions", _completion(core, io.CHAT))
    app.router.add_post("/v1/completions", _completion(core, io.COMPLETION))
    app.router.add_post("/v1/responses", _completion(core, rio.RESPONSES))
    stored = _simple(core, lambda request, _: core.responses.get(request.match_info["rid"]))
    app.router.add_get("/v1/responses/{rid}", stored)
    cancel = _simple(core, lambda request, _: core.responses.cancel(request.match_info["rid"]))
    app.router.add_post("/v1/responses/{rid}/cancel", cancel)
    for path in ("/tokenize", "/detokenize", "/v1/embeddings"):
        app.router.add_post(path, _simple(core, lambda request, raw: core.simple(request.path, raw)))
    app.router.add_get("/version", _static(core, lambda: (extras.version(), "application/json")))
    app.router.add_get("/health", _static(core, lambda: (b"", "text/plain")))
    app.router.add_get("/v1/models", _static(core, lambda: (core.models_body(), "application/json")))
    app.router.add_get("/metrics", _static(core, core.metrics_body))
    app.router.add_get("/emulator/stats", _static(core, lambda: (core.stats_body(), "application/json")))

    async def start(_: web.Application) -> None:
        core.ensure_running()

    async def stop(_: web.Application) -> None:
        await core.aclose()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


def _static(core: EmulatorCore, body: Callable[[], tuple[bytes, str]]) -> Handler:
    async def handler(_: web.Request) -> web.StreamResponse:
        payload, content_type = body()
        return web.Response(body=payload, headers={**core.headers, "content-type": content_type})

    return handler


def _simple(core: EmulatorCore, answer: Callable[[web.Request, bytes], bytes]) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            body = answer(request, await request.read())
        except io.RequestError as exc:
            return _error(core, exc)
        return web.Response(body=body, headers={**core.headers, "content-type": "application/json"})

    return handler


def _completion(core: EmulatorCore, kind: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            parsed = core.parse(kind, await request.read())
        except io.RequestError as exc:
            return _error(core, exc)
        job = core.start(parsed)
        try:
            if not parsed.stream:
                body = await full_body(job)
                return web.Response(body=body or b"", headers={**core.headers, "content-type": "application/json"})
            response = web.StreamResponse(
                headers={
                    **core.headers,
                    "content-type": "text/event-stream; charset=utf-8",
                    "cache-control": "no-cache",
                }
            )
            await response.prepare(request)
            async for event in stream_events(job):
                await response.write(event)
            await response.write_eof()
            return response
        finally:
            core.finish(job)

    return handler


def _error(core: EmulatorCore, error: io.RequestError) -> web.Response:
    return web.Response(
        status=error.status, body=error.body(), headers={**core.headers, "content-type": "application/json"}
    )


def _errors_with_headers(core: EmulatorCore) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            return _error(core, io.RequestError(exc.status, exc.reason))

    return middleware
