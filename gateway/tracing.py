"""OpenTelemetry tracing of proxied requests (``SPECGATE_TRACING=otel``; ``pip install specgate[otel]``).

Imported only when tracing is on (``GatewayState`` imports it lazily), so a gateway without it neither
imports OpenTelemetry nor does any per-request work for it: the relay checks ``state.tracer is None``.

Each routed request gets a SERVER span (``POST /v1/chat/completions``) carrying the decision (pool, reason,
rule, task, model, prompt and output tokens, status, whether it was retried), as a child of the client's
``traceparent`` when it sent one. Each upstream attempt is a CLIENT child span, and its context goes to the
pool in the forwarded ``traceparent`` (the W3C propagator, or whatever ``OTEL_PROPAGATORS`` names), so a
vLLM started with ``--otlp-traces-endpoint`` continues the same trace.

Exporting follows the standard variables: ``OTEL_TRACES_EXPORTER`` (``otlp``, the default, over HTTP/protobuf;
``console``; ``none``), ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
``OTEL_SERVICE_NAME`` (default ``specgate``), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*`` for the batch
processor. Spans are exported from the batch processor's thread, off the event loop. The provider belongs to
the gateway instance (no global provider is set), so tests attach an in-memory exporter to ``provider``.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Protocol

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from gateway import __version__
from gateway.decide import Decision
from gateway.features import RequestFeatures


class TracedRequest(Protocol):
    """What the relay (``gateway.proxy._Relay``) exposes to the tracer."""

    request_id: str
    path: str
    pool: str
    reason: str
    status: int
    ttft: float | None
    tokens: int
    retried: bool
    started: float
    forward_headers: dict[str, str]

    @property
    def features(self) -> RequestFeatures: ...
    @property
    def decision(self) -> Decision: ...


def _exporter() -> SpanExporter | None:
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if kind == "none":
        return None
    if kind == "console":
        return ConsoleSpanExporter()
    if kind != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER={kind!r}: specgate supports otlp (HTTP/protobuf), console or none")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout from OTEL_EXPORTER_OTLP_* variables


class RequestTracer:
    """Builds the spans of each request; owns its :class:`TracerProvider`."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        if provider is None:
            resource = Resource.create({"service.name": "specgate", "service.version": __version__})
            provider = TracerProvider(resource=resource)  # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES apply
            exporter = _exporter()
            if exporter is not None:
                provider.add_span_processor(BatchSpanProcessor(exporter))
        self.provider = provider
        self._tracer = provider.get_tracer("specgate", __version__)

    def begin(self, request: TracedRequest) -> RequestTrace:
        """The request's span, started when the request arrived, parented on the client's ``traceparent``.
        Its attributes are set once, at the end (each one costs a validation pass in the SDK)."""
        headers = request.forward_headers
        parent = propagate.extract(headers) if "traceparent" in headers else None
        start_ns = time.time_ns() - int((time.perf_counter() - request.started) * 1e9)
        name = f"POST {request.path}"
        span = self._tracer.start_span(name, context=parent, kind=SpanKind.SERVER, start_time=start_ns)
        return RequestTrace(self._tracer, span)

    async def shutdown(self) -> None:
        """Export what is buffered and stop the exporter thread (blocking calls, so off the event loop)."""
        await asyncio.to_thread(self.provider.shutdown)


class RequestTrace:
    """The spans of one request: the request span and the current upstream attempt's child span."""

    __slots__ = ("_span", "_tracer", "_upstream")

    def __init__(self, tracer: trace.Tracer, span: Span) -> None:
        self._tracer = tracer
        self._span = span
        self._upstream: Span | None = None

    def upstream(self, pool: str, url: str, headers: dict[str, str]) -> dict[str, str]:
        """Start the span of one upstream attempt; the headers to send carry its ``traceparent``."""
        if self._upstream is not None:  # the previous attempt failed before its first byte
            self._upstream.set_status(Status(StatusCode.ERROR, "failed before the first byte; retried"))
            self._upstream.end()
        context = trace.set_span_in_context(self._span)
        attributes = {"specgate.pool": pool, "server.address": url}
        self._upstream = self._tracer.start_span(
            "upstream", context=context, kind=SpanKind.CLIENT, attributes=attributes
        )
        carrier = dict(headers)
        propagate.inject(carrier, context=trace.set_span_in_context(self._upstream))
        return carrier

    def end(self, request: TracedRequest) -> None:
        status = request.status
        error = Status(StatusCode.ERROR, f"status {status}") if status >= 500 or status == 0 else None
        if self._upstream is not None:
            self._upstream.set_attribute("http.response.status_code", status)
            if error is not None:
                self._upstream.set_status(error)
            self._upstream.end()
        features = request.features
        attributes: dict[str, Any] = {
            "specgate.request_id": request.request_id,
            "specgate.pool": request.pool,  # where it went (after a retry, the other pool)
            "specgate.reason": request.reason,
            "specgate.rule": request.decision.rule or "",
            "specgate.task": features.task,
            "specgate.retried": request.retried,
            "gen_ai.request.model": features.model,
            "gen_ai.request.max_tokens": features.max_tokens,
            "gen_ai.usage.input_tokens": features.prompt_tokens,  # the gateway's estimate (chars / 4)
            "gen_ai.usage.output_tokens": request.tokens,
            "http.response.status_code": status,
        }
        if request.ttft is not None:
            attributes["specgate.ttft_s"] = request.ttft
        span = self._span
        span.set_attributes(attributes)
        if error is not None:
            span.set_status(error)
        span.end()
