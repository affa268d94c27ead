"""Live signals for the decider: vLLM engine stats, Prometheus queries, QPS shared through Redis.

Everything here runs off the request path, in background tasks owned by
:class:`~gateway.signals.hub.SignalHub`; the request path only reads ``hub.snapshot`` and bumps a local
counter.
"""

# The decider's QPS when Prometheus is configured. 30 s is six scrapes at the deploy config's 5 s interval:
# rate() stays defined if one scrape is lost, and the value follows a change of load within about 15 s
# without flapping on single bursts.
DEFAULT_QPS_QUERY = "sum(rate(specgate_requests_total[30s]))"
