"""A fast fake OpenAI-compatible upstream with controllable delays and failures (aiohttp.web).

Behaviour per request comes from headers, which the gateway forwards unchanged:

    x-fake-status: 500        reply with this status and an OpenAI-style error body
    x-fake-delay: 0.2         seconds before the response head
    x-fake-chunks: 64         stream events (stream requests) / completion tokens (non-stream)
    x-fake-interval: 0.01     seconds between stream events
    x-fake-stall-after: 3     stop sending (but keep the connection) after this many events
    x-fake-cut-after: 3       drop the connection after this many stream events (a replica dying mid-stream)
    x-fake-cut-partial: 1     ... having sent the first half of the next event
    x-fake-role: 1            start a chat stream with a role-only event, as vLLM does
    x-fake-reset: 1           drop the connection without answering
    x-fake-continue-status: 500   answer a continuation (below) with this status

A chat request with ``continue_final_message: true`` is a continuation, as vLLM answers it: its stream goes
on from the final assistant message's text (``t0 t1 t2 `` continues with ``t3``), starts with a role-only
event, has its own id, and counts that text in its usage's prompt tokens. The stall and cut knobs apply only
to requests that are not continuations (the gateway forwards the client's headers with both).

``FakeUpstream.healthy`` switches ``/health`` between 200 and 503 (``health_delay``: seconds before it
answers); ``requests`` counts what arrived and ``cancelled`` counts streams the client went away from.
``base_delay`` (``--delay``, or ``POST /fake/delay?s=1.5`` on a running process) delays every response head
that sets no ``x-fake-delay``: a slow replica that still answers. Any other path is echoed (method, path,
query, body) as JSON, so a test can tell exactly what the gateway forwarded (``seen`` notes every request, so
also that it forwarded nothing).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import orjson
from aiohttp import web

from gateway.bench import shapes


def _error(message: str, status: int) -> dict[str, Any]:
    """An error body in vLLM's (OpenAI's) shape."""
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}


class _Cut(ConnectionResetError):
    """The fake dropped a stream on purpose (not a client going away)."""


class FakeUpstream:
    def __init__(self, model: str = "fake-model", name: str = "fake") -> None:
        self.model = model
        self.name = name
        self.healthy = True
        self.health_delay = 0.0
        self.base_delay = 0.0
        self.requests = 0
        self.cancelled = 0
        self.events_sent = 0  # stream events written, over all streams
        self.cuts = 0  # streams dropped by x-fake-cut-after
        self.continuations = 0  # continue_final_message requests answered
        self.last_body: dict[str, Any] | None = None
        self.last_headers: dict[str, str] = {}
        self.tokens_per_word: int | None = None  # set: /tokenize counts this many tokens per word (else echoes)
        # (method, raw path, Host) of the latest requests, health checks too; bounded for long-running use
        self.seen: deque[tuple[str, str, str]] = deque(maxlen=10_000)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/fake/delay", self._set_delay)
        app.router.add_route("*", "/{tail:.*}", self._echo)
        return app

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.seen.append((request.method, request.raw_path, request.headers.get("Host", "")))
        response: web.StreamResponse = await handler(request)
        return response

    async def _set_delay(self, request: web.Request) -> web.Response:
        self.base_delay = float(request.query.get("s", "0"))
        return web.Response(text=str(self.base_delay))

    async def _echo(self, request: web.Request) -> web.Response:
        if request.path == "/metrics":
            raise web.HTTPNotFound()  # the fake has no engine metrics (the gateway's scrapes must see that)
        body = await request.read()
        delay = float(request.headers.get("x-fake-delay", 0))
        if delay:
            await asyncio.sleep(delay)
        echo: dict[str, Any] = {
            "upstream": self.name,
            "method": request.method,
            "path": request.path,
            "query": request.query_string,
            "content_type": request.headers.get("content-type"),
            "request_id": request.headers.get("x-request-id"),
            "body": body.decode("utf-8", "replace"),
        }
        usage = request.headers.get("x-fake-usage")  # as generating APIs report it (OpenAI's and Anthropic's names)
        if usage is not None:
            echo["usage"] = {"completion_tokens": int(usage), "output_tokens": int(usage)}
        status = int(request.headers.get("x-fake-status", 200))
        return web.Response(status=status, body=orjson.dumps(echo), content_type="application/json")

    async def _tokenize(self, request: web.Request) -> web.Response:
        if self.tokens_per_word is None:
            return await self._echo(request)  # the pass-through tests see what was forwarded
        prompt = (await request.json()).get("prompt", "")
        return web.json_response({"count": len(str(prompt).split()) * self.tokens_per_word, "max_model_len": 2048})

    async def _health(self, _: web.Request) -> web.Response:
        if self.health_delay:
            await asyncio.sleep(self.health_delay)
        return web.Response(status=200 if self.healthy else 503)

    async def _models(self, _: web.Request) -> web.Response:
        data = {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "fake"}]}
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        raw = await request.read()
        body = orjson.loads(raw)
        self.last_body, self.last_headers = body, dict(request.headers)
        h = request.headers
        if h.get("x-fake-reset"):
            assert request.transport is not None
            request.transport.close()
            raise ConnectionResetError("fake reset")
        delay = float(h.get("x-fake-delay", self.base_delay))
        if delay:
            await asyncio.sleep(delay)
        status = int(h.get("x-fake-status", 200))
        if status != 200:
            error = _error(f"fake upstream error {status}", status)
            return web.Response(status=status, body=orjson.dumps(error), content_type="application/json")
        try:  # what vLLM's request validation would refuse with a 400 (the gateway relays bodies as they are)
            count = int(h.get("x-fake-chunks", body.get("max_tokens") or 16))
            interval = float(h.get("x-fake-interval", 0))
            if not isinstance(body.get("stream_options") or {}, dict) or not 0 <= count <= 100_000:
                raise ValueError("stream_options must be an object, the token count 0..100000")
        except (TypeError, ValueError) as exc:
            error = _error(f"fake upstream: {exc}", 400)
            return web.Response(status=400, body=orjson.dumps(error), content_type="application/json")
        if not body.get("stream"):
            extra = orjson.loads(h.get("x-fake-response-headers", "{}"))  # e.g. hop-by-hop ones, for tests
            return web.Response(body=self._completion(body, count), content_type="application/json", headers=extra)
        if body.get("continue_final_message"):
            return await self._continue(request, body, count, interval)
        return await self._stream(request, body, count, interval, h.get("x-fake-stall-after"))

    def _cut(self, request: web.Request, data: bytes) -> web.StreamResponse:
        """Die mid-stream: write half of ``data`` (if any) and drop the connection, as a killed replica would."""
        transport = request.transport
        assert transport is not None
        if data:
            transport.write(b"%x\r\n%b\r\n" % (len(data) // 2, data[: len(data) // 2]))
        transport.abort()
        self.cuts += 1
        raise _Cut("fake cut")

    def _completion(self, body: dict[str, Any], count: int) -> bytes:
        return orjson.dumps(shapes.completion(self.model, "messages" in body, count, self.name))

    async def _continue(
        self, request: web.Request, body: dict[str, Any], count: int, interval: float
    ) -> web.StreamResponse:
        """A continuation: the events after those whose text the final assistant message holds."""
        self.continuations += 1
        status = int(request.headers.get("x-fake-continue-status", 200))
        if status != 200:
            error = _error(f"fake continuation error {status}", status)
            return web.Response(status=status, body=orjson.dumps(error), content_type="application/json")
        start = len(str(body["messages"][-1].get("content") or "").split())
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or count
        end = min(count, start + limit) if "x-fake-chunks" in request.headers else start + count
        return await self._stream(request, body, end, interval, None, start=start)

    async def _stream(
        self, request: web.Request, body: dict[str, Any], count: int, interval: float, stall_after: str | None,
        start: int = 0,
    ) -> web.StreamResponse:  # fmt: skip
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        chat = "messages" in body
        cut = request.headers.get("x-fake-cut-after") if not start else None
        try:
            if chat and (start or request.headers.get("x-fake-role")):
                event = {**shapes.stream_event(self.model, chat, 0, 1), "choices": [shapes.role_choice()]}
                await response.write(b"data: " + orjson.dumps(shapes.continued(event, start)) + b"\n\n")
            for index in range(start, count):
                if stall_after is not None and index >= int(stall_after):
                    await asyncio.sleep(3600)
                data = b"data: " + orjson.dumps(shapes.continued(shapes.stream_event(self.model, chat, index, count),
                                                                 start)) + b"\n\n"  # fmt: skip
                if cut is not None and index >= int(cut):
                    return self._cut(request, data if request.headers.get("x-fake-cut-partial") else b"")
                await response.write(data)
                self.events_sent += 1
                if interval:
                    await asyncio.sleep(interval)
            if cut is not None and int(cut) >= count:  # the answer is whole; usage and [DONE] are not
                return self._cut(request, b"")
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = shapes.usage_event(count - start, prompt=8 + start)
                await response.write(b"data: " + orjson.dumps(usage) + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except _Cut:
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1
            raise
        return response


def main(argv: list[str] | None = None) -> None:
    """``python -m gateway.bench.fake_upstream --port N``: serve the fake on loopback (for benchmarks)."""
    import argparse

    import uvloop

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--name", default="fake", help="reported as `served_by` in non-stream replies")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before every response head")
    args = parser.parse_args(argv)
    uvloop.install()
    fake = FakeUpstream(args.model, args.name)
    fake.base_delay = args.delay
    web.run_app(fake.app(), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
