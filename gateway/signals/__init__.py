"""Live signals for the decider: vLLM engine stats, Prometheus queries, QPS shared through Redis.

Everything here runs off the request path, in background tasks owned by
:class:`~gateway.signals.hub.SignalHub`; the request path only reads ``hub.snapshot`` and bumps a local
counter.
"""

# The decider's QPS when Prometheus is configured. The counter has one series per gateway, present from
# start-up, so rate() never under-reads a series that appeared mid-range (as it would for a label set of
# specgate_requests_total{pool,reason,task,status} first seen when decisions switch pools). 30 s is six
# scrapes at the deploy config's 5 s interval: rate() survives a lost scrape and follows a change of load
# within about 15 s without flapping on single bursts.
DEFAULT_QPS_QUERY = "sum(rate(specgate_routed_requests_total[30s]))"
