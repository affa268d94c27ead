"""Background PromQL queries: the gateway-wide QPS and named signals that rules can reference.

``prometheus-api-client`` is synchronous (requests), so each poll runs in a worker thread via
``asyncio.to_thread`` under a deadline. A poll that overruns its deadline is abandoned; while its thread is
still blocked (requests honours its own timeout too, so not for long) the next ticks are skipped rather than
piling up threads. The request path never waits on any of this.

Each query keeps its last good value and when it was obtained. The values are used only while the latest
poll succeeded and for at most ``stale_after_s``: after a failed or slow poll the hub falls back at once
(QPS to Redis's shared window or the local one; a signal reads as unknown) and switches back on the next
good poll.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.util.retry import Retry

from gateway.signals import DEFAULT_QPS_QUERY


class NoData(ValueError):
    """The query answered but returned no series (e.g. the counter has not been scraped twice yet)."""


@dataclass(frozen=True, slots=True)
class QueryValue:
    value: float
    at: float  # clock time of the successful poll


@dataclass(frozen=True, slots=True)
class PollOutcome:
    ok: bool  # Prometheus answered in time (even if some queries returned no data)
    error: str | None
    at: float


def scalar_of(result: Any) -> float:
    """An instant-query result as one number: a scalar, or the sum of a vector's samples."""
    if isinstance(result, list) and len(result) == 2 and not isinstance(result[0], dict):
        return float(result[1])  # resultType scalar: [ts, "value"]
    if not isinstance(result, list) or not result:
        raise NoData("the query returned no series")
    return sum(float(sample["value"][1]) for sample in result)


class PrometheusPoller:
    """The QPS query and the named signal queries; the hub calls :meth:`poll_once` on its interval."""

    def __init__(
        self,
        url: str,
        *,
        qps_query: str | None = DEFAULT_QPS_QUERY,
        signal_queries: Mapping[str, str] | None = None,
        timeout_s: float = 1.0,
        stale_after_s: float = 5.0,
        warmup_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.qps_query = qps_query
        self.signal_queries = dict(signal_queries or {})
        self.timeout_s = timeout_s
        self.stale_after_s = stale_after_s
        self.warmup_s = warmup_s
        self._clock = clock
        self._session = requests.Session()
        self._client = PrometheusConnect(
            url=url,
            retry=Retry(total=0, connect=0, read=0),  # fail fast; the next tick is the retry
            session=self._session,
            timeout=timeout_s,  # type: ignore[arg-type]  # annotated int; requests takes float seconds
        )
        self._inflight: asyncio.Future[dict[str, float | Exception]] | None = None
        self._values: dict[str, QueryValue] = {}
        self.query_errors: dict[str, str] = {}
        self.last_outcome: PollOutcome | None = None
        self.last_ok_at: float | None = None
        self.data_since: dict[str, float] = {}  # per query: first poll of its current unbroken run of data
        self._down_since: float | None = None

    def _queries(self) -> dict[str, str]:
        queries = {f"signal:{name}": q for name, q in self.signal_queries.items()}
        if self.qps_query:
            queries["qps"] = self.qps_query
        return queries

    def _run_queries(self, queries: Mapping[str, str]) -> dict[str, float | Exception]:
        """In a worker thread. Connection failures abort the poll; a bad or empty query only that entry."""
        results: dict[str, float | Exception] = {}
        for key, query in queries.items():
            try:
                results[key] = scalar_of(self._client.custom_query(query))
            except (PrometheusApiClientException, NoData, ValueError, KeyError) as exc:
                results[key] = exc
        return results

    async def poll_once(self) -> PollOutcome:
        previous = self._inflight
        if previous is not None:
            if not previous.done():
                return self._record_failure("previous query still running (Prometheus slow)")
            if not previous.cancelled():
                previous.exception()  # an abandoned poll's late outcome: already reported as a timeout
        self._inflight = asyncio.ensure_future(asyncio.to_thread(self._run_queries, self._queries()))
        try:
            results = await asyncio.wait_for(asyncio.shield(self._inflight), self.timeout_s)
        except TimeoutError:
            return self._record_failure(f"no answer within {self.timeout_s} s")
        except requests.RequestException as exc:
            return self._record_failure(f"{type(exc).__name__}: {exc}")
        now = self._clock()
        self._recovered(now)
        for key, result in results.items():
            if isinstance(result, Exception):
                self.query_errors[key] = f"{type(result).__name__}: {result}"
                self.data_since.pop(key, None)
            else:
                self.query_errors.pop(key, None)
                self.data_since.setdefault(key, now)
                self._values[key] = QueryValue(result, now)
        self.last_ok_at = now
        self.last_outcome = PollOutcome(ok=True, error=None, at=now)
        return self.last_outcome

    def _record_failure(self, error: str) -> PollOutcome:
        now = self._clock()
        if self._down_since is None:
            self._down_since = now
        self.last_outcome = PollOutcome(ok=False, error=error, at=now)
        return self.last_outcome

    def _recovered(self, now: float) -> None:
        """After an outage longer than ``stale_after_s`` (a restart, say), Prometheus's ranges have a hole:
        every query warms up again. A shorter blip (one slow poll) keeps its values usable at once."""
        if self._down_since is not None and now - self._down_since > self.stale_after_s:
            self.data_since.clear()
        self._down_since = None

    @property
    def up(self) -> bool:
        return self.last_outcome is not None and self.last_outcome.ok

    def warming_up(self, key: str = "qps") -> bool:
        """The query has returned data for less than ``warmup_s`` (since start, a long outage, or a run of
        no data): rate() over a range that is still partly empty reads low, so its values wait."""
        since = self.data_since.get(key)
        return since is None or self._clock() - since < self.warmup_s

    def age_s(self) -> float | None:
        return None if self.last_ok_at is None else self._clock() - self.last_ok_at

    def _fresh(self, key: str) -> QueryValue | None:
        """A value is used only while Prometheus answers (and has for ``warmup_s``), its query's latest run
        succeeded, and it is recent (skipped polls count as failures, so the age check is belt and braces)."""
        value = self._values.get(key)
        if not self.up or self.warming_up(key) or key in self.query_errors or value is None:
            return None
        return value if self._clock() - value.at <= self.stale_after_s else None

    def qps(self) -> QueryValue | None:
        """The last QPS value if it is fresh and the query's latest run returned data."""
        return self._fresh("qps")

    def signals(self) -> dict[str, QueryValue]:
        fresh = {name: self._fresh(f"signal:{name}") for name in self.signal_queries}
        return {name: value for name, value in fresh.items() if value is not None}

    async def close(self) -> None:
        if self._inflight is not None:
            self._inflight.cancel()  # the thread finishes on its own (bounded by the requests timeout)
            await asyncio.gather(self._inflight, return_exceptions=True)
        self._session.close()
