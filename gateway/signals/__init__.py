"""Live signals for the decider: vLLM engine stats, Prometheus queries, QPS shared through Redis.

Everything here runs off the request path, in background tasks owned by
:class:`~gateway.signals.hub.SignalHub`; the request path only reads ``hub.snapshot`` and bumps a local
counter.
"""
