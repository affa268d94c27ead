"""``specgate bench step-cost``: what drafting ``k`` tokens costs an engine's step, measured.

For each engine and each concurrency ``B``: ``B`` streams at once (closed), each ``tokens`` tokens long with
``ignore_eos`` and temperature 0, ``rounds`` times. An engine's step time at ``B`` is the median over the streams of
each one's mean interval between content chunks (its span over its chunks less one): vLLM sends a request one chunk
a step, a speculative step's accepted tokens together. The engine's ``k`` is read from its own counters (draft
tokens per draft over the run; 0 with none), so the engines can be any vLLM servers: one plain, the others
speculative with ``k`` pinned (a one-range ``num_speculative_tokens_per_batch_size``). ``--cpu-k`` launches such CPU
engines one at a time.

The fit is the emulator's step model in the rig's own terms (``backends/emulator/timing.py``):

- a plain step of ``n`` tokens: ``T(n) = overhead + a n`` (least squares over the plain engine's levels);
- a speculative step at ``B`` requests and ``k`` draft tokens: ``k c T(B)`` of drafting plus the verification
  of ``B`` tokens and ``B k`` drafted ones, each drafted one costing ``v a``:
  ``S(B, k) = k c T(B) + T(B) + v a B k``;
- ``c`` and ``v`` by least squares in relative error (both at least 0).

``c`` and ``v`` trade off: drafting adds ``k c overhead + k c a B``, verification ``k v a B``, so over a few batch
levels the data hold ``c`` (from the intercept) and ``c + v`` (from the slope) but little of how the slope splits.
Steps 5 % off move ``v`` by 0.2 or more in a third of fits at ``B`` = 1, 4, 8 while the fitted steps stay within
15 %. The command reports each ratio's spread over the fits that leave one measured step out: a wide one says
measure more batch levels (up to the engine's ``max_num_seqs``) before trusting the ratio, though the fitted
steps themselves hold.

A profile prices the verification of ``B (k + 1)`` tokens as that many decode tokens, ``v = 1`` (the default
``verify_cost_ratio``); ``v`` well below 1 would say the profile overstates what ``k`` costs.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import orjson
from rich.console import Console
from rich.table import Table

from gateway.bench.compare import discover_model, read_engine_stats, read_spec_counters
from gateway.signals.vllm_metrics import MetricsParseError, SpecCounters

if TYPE_CHECKING:
    from backends.emulator.profiles import Profile

# a prompt whose answer an n-gram drafter finds in the prompt: every step drafts (a step without a match drafts
# nothing, and would be timed as a plain one)
COPY_PROMPT = "Repeat the following text exactly, word for word:\n" + " ".join(
    f"The {w} sat by the river and counted {n} stones."
    for w, n in (("fox", 3), ("owl", 7), ("cat", 2), ("dog", 9), ("elk", 4), ("hen", 6))
)


class StepCostError(Exception):
    """A run that cannot be measured or fitted (no plain engine, an engine that does not stream)."""


@dataclass(frozen=True, slots=True)
class StepPoint:
    engine: str
    k: int
    batch: int
    step_s: float  # median over the level's streams of each one's mean interval between content chunks
    acceptance: float | None  # vLLM's accepted / drafted tokens over the level (None: no speculation)
    ran: int = 0  # where the engine ran fewer than ``batch`` at once (its max_num_seqs held the rest waiting):
    # how many it ran; 0: all of them. Such a level's steps mix batch sizes (a full batch, then the rest's), so
    # the fit leaves it out


@dataclass(frozen=True, slots=True)
class Fit:
    overhead_s: float
    per_token_s: float  # a
    draft_cost_ratio: float  # c
    verify_cost_ratio: float  # v

    def plain_s(self, tokens: float) -> float:
        return self.overhead_s + self.per_token_s * tokens

    def speculative_s(self, batch: int, k: int) -> float:
        plain = self.plain_s(batch)
        return k * self.draft_cost_ratio * plain + plain + self.verify_cost_ratio * self.per_token_s * batch * k


@dataclass
class StepCostResult:
    points: list[StepPoint] = field(default_factory=list)
    fit: Fit | None = None
    spread: dict[str, tuple[float, float]] | None = None  # see :func:`spread`


async def _stream(
    client: httpx.AsyncClient, url: str, model: str, prompt: str, tokens: int, stepping: asyncio.Event | None = None
) -> float | None:
    """One stream's mean interval between content chunks, in seconds (None: fewer than two chunks); sets
    ``stepping`` at its third chunk.

    The mean over the stream's span, not its intervals one by one: a client that reads late (a loaded machine)
    gets several chunks in one read, and their intervals read microseconds while the next reads the steps missed;
    a median of those read 13 us for a CPU engine's step in one CI run. The span holds however they bunch."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
    stamps: list[float] = []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise StepCostError(f"{url}: HTTP {response.status_code}: {response.text[:200]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = orjson.loads(line[6:]).get("choices") or ()
            if choices and (choices[0].get("delta") or {}).get("content"):
                stamps.append(time.perf_counter())
                if stepping is not None and len(stamps) == 3:
                    stepping.set()
    if len(stamps) < 2:
        return None
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


async def _model(client: httpx.AsyncClient, url: str) -> str:
    try:
        return (await discover_model(client, url))[0]
    except (KeyError, IndexError, TypeError) as exc:
        raise StepCostError(f"{url}/v1/models lists no model") from exc


async def _running(client: httpx.AsyncClient, url: str, stepping: asyncio.Event) -> tuple[float, float] | None:
    """The engine's running and waiting requests once a stream is stepping (one scrape a round, so the steps
    timed are not disturbed); None where the engine does not say."""
    await stepping.wait()
    try:
        stats = await read_engine_stats(client, url)
    except (httpx.HTTPError, MetricsParseError):
        return None
    return stats.running, stats.waiting


def _k(before: SpecCounters | None, after: SpecCounters | None) -> int:
    if before is None or after is None or after.drafts <= before.drafts:
        return 0
    return round((after.draft_tokens - before.draft_tokens) / (after.drafts - before.drafts))


async def measure_engine(
    url: str, batches: Sequence[int], tokens: int = 64, rounds: int = 2, prompt: str = COPY_PROMPT,
    timeout_s: float = 600.0,
) -> list[StepPoint]:  # fmt: skip
    """One engine's step time at each concurrency in ``batches`` (one unmeasured request first)."""
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        model = await _model(client, url)
        await _stream(client, url, model, prompt, 4)
        first = await read_spec_counters(client, url)
        levels = []
        for batch in batches:
            before = await read_spec_counters(client, url)
            steps: list[float] = []  # each stream's mean step
            ran = batch  # requests the engine ran at once: fewer than asked where its max_num_seqs holds the rest
            for _ in range(rounds):
                stepping = asyncio.Event()
                sample = asyncio.ensure_future(_running(client, url, stepping))
                try:
                    runs = await asyncio.gather(
                        *(_stream(client, url, model, prompt, tokens, stepping) for _ in range(batch))
                    )
                finally:
                    stepping.set()
                    seen = await sample
                steps += [run for run in runs if run is not None]
                if seen is not None and seen[1] > 0 and 1 <= seen[0] < batch:
                    ran = min(ran, round(seen[0]))
            if not steps:
                raise StepCostError(f"{url}: no stream gave two content chunks (tokens={tokens})")
            after = await read_spec_counters(client, url)
            acceptance = None
            if before is not None and after is not None and after.draft_tokens > before.draft_tokens:
                drafted = after.draft_tokens - before.draft_tokens
                acceptance = (after.accepted_tokens - before.accepted_tokens) / drafted
            levels.append((batch, ran if ran < batch else 0, statistics.median(steps), acceptance))
        k = _k(first, await read_spec_counters(client, url))
    return [StepPoint(url, k, batch, step, acceptance, ran) for batch, ran, step, acceptance in levels]


def fit(points: Sequence[StepPoint]) -> Fit:
    """The step model above, fitted: the plain engine's line, then ``c`` and ``v`` from the others (levels the
    engine ran part of at a time left out)."""
    points = [p for p in points if not p.ran]
    plain = [(p.batch, p.step_s) for p in points if p.k == 0]
    if len({b for b, _ in plain}) < 2:
        raise StepCostError("the fit needs a plain engine (k = 0) measured at two concurrency levels or more")
    n = len(plain)
    mean_b, mean_t = sum(b for b, _ in plain) / n, sum(t for _, t in plain) / n
    spread = sum((b - mean_b) ** 2 for b, _ in plain)
    a = max(sum((b - mean_b) * (t - mean_t) for b, t in plain) / spread, 0.0)
    overhead = max(mean_t - a * mean_b, 0.0)
    # S - T = c (k T) + v (a B k): two unknowns, least squares in relative error (each row divided by S)
    rows = []
    for p in points:
        if p.k > 0:
            t = overhead + a * p.batch
            rows.append((p.k * t / p.step_s, a * p.batch * p.k / p.step_s, (p.step_s - t) / p.step_s))
    c = v = 0.0
    if rows:
        c, v = _nonnegative_least_squares(rows)
    return Fit(overhead, a, c, v)


def spread(points: Sequence[StepPoint], whole: Fit | None = None) -> dict[str, tuple[float, float]]:
    """The lowest and highest ``draft_cost_ratio`` and ``verify_cost_ratio`` over the fit of all ``points``
    (``whole``, where the caller has it) and the fits that leave one of them out (those that can still be
    fitted): how firmly the points hold each."""
    points = [p for p in points if not p.ran]
    fits = [whole if whole is not None else fit(points)]
    for i in range(len(points)):
        try:
            fits.append(fit([*points[:i], *points[i + 1 :]]))
        except StepCostError:
            continue
    return {
        name: (min(getattr(f, name) for f in fits), max(getattr(f, name) for f in fits))
        for name in ("draft_cost_ratio", "verify_cost_ratio")
    }


def fit_result(result: StepCostResult) -> None:
    """``result``'s fit and its spread, from its points."""
    result.fit = fit(result.points)
    result.spread = spread(result.points, result.fit)


def _nonnegative_least_squares(rows: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """``(x, y) >= 0`` minimising the sum of ``(x r0 + y r1 - r2)^2``: the unconstrained solution, or the best
    with one of them at 0."""

    def sse(x: float, y: float) -> float:
        return sum((x * r0 + y * r1 - r2) ** 2 for r0, r1, r2 in rows)

    s00 = sum(r0 * r0 for r0, _, _ in rows)
    s11 = sum(r1 * r1 for _, r1, _ in rows)
    s01 = sum(r0 * r1 for r0, r1, _ in rows)
    s02 = sum(r0 * r2 for r0, _, r2 in rows)
    s12 = sum(r1 * r2 for _, r1, r2 in rows)
    candidates = [(0.0, 0.0)]
    if s00 > 0:
        candidates.append((max(s02 / s00, 0.0), 0.0))
    if s11 > 0:
        candidates.append((0.0, max(s12 / s11, 0.0)))
    det = s00 * s11 - s01 * s01
    if det > 1e-12 * max(s00 * s11, 1e-300):
        x, y = (s02 * s11 - s12 * s01) / det, (s12 * s00 - s02 * s01) / det
        if x >= 0 and y >= 0:
            candidates.append((x, y))
    return min(candidates, key=lambda xy: sse(*xy))


def measure(
    urls: Sequence[str], batches: Sequence[int], tokens: int = 64, rounds: int = 2, prompt: str = COPY_PROMPT
) -> StepCostResult:
    """Every engine in turn (one at a time, so they do not share the machine while timed), then the fit."""
    result = StepCostResult()
    for url in urls:
        result.points += asyncio.run(measure_engine(url, batches, tokens, rounds, prompt))
    if any(p.k == 0 for p in result.points):
        fit_result(result)
    return result


def report(result: StepCostResult, console: Console) -> None:
    plain = {p.batch: p.step_s for p in result.points if p.k == 0}
    table = Table(title="specgate bench step-cost: median over streams of the mean interval between chunks")
    for name in ("engine", "k", "B", "step ms", "x plain", "fit x plain", "accepted/drafted"):
        table.add_column(name, justify="left" if name == "engine" else "right")
    model = result.fit
    for p in sorted(result.points, key=lambda p: (p.k, p.engine, p.batch)):
        base = plain.get(p.batch)
        ratio = f"{p.step_s / base:.2f}" if base else "-"
        fitted = "-"
        if model is not None and base and not p.ran:
            fitted = f"{(model.speculative_s(p.batch, p.k) if p.k else model.plain_s(p.batch)) / base:.2f}"
        accepted = "-" if p.acceptance is None else f"{p.acceptance:.2f}"
        batch = f"{p.batch} ({p.ran} ran)" if p.ran else str(p.batch)
        table.add_row(p.engine, str(p.k), batch, f"{p.step_s * 1000:.1f}", ratio, fitted, accepted)
    console.print(table)
    if any(p.ran for p in result.points):
        console.print('B "S (R ran)": the engine ran R of the S streams at once (its max_num_seqs), the rest waited; '
                      "such a level's steps mix batch sizes, and the fit leaves it out")  # fmt: skip
    if model is None:
        console.print("no plain engine (k = 0) measured: no fit")
        return
    console.print(
        f"fit: plain step {model.overhead_s * 1000:.2f} ms + {model.per_token_s * 1000:.3f} ms a token; a draft "
        f"step c = {model.draft_cost_ratio:.3f} x a plain step; a drafted token verified at v = "
        f"{model.verify_cost_ratio:.2f} x a decode token (a profile's verify_cost_ratio; 1 = priced as decode)"
    )
    if result.spread and any(p.k for p in result.points):
        (c_low, c_high), (v_low, v_high) = result.spread["draft_cost_ratio"], result.spread["verify_cost_ratio"]
        console.print(
            f"leaving one step out: c {c_low:.3f}-{c_high:.3f}, v {v_low:.2f}-{v_high:.2f} (c and v trade off; a "
            "wide range wants more batch levels, up to the engine's max_num_seqs; the fitted steps hold either way)"
        )
    timed = [p for p in result.points if p.k > 0 and p.step_s > 0 and not p.ran]
    residuals = [math.log(p.step_s / model.speculative_s(p.batch, p.k)) for p in timed]
    if residuals:
        console.print(f"speculative steps against the fit: worst {max(map(abs, residuals)):.1%}, "
                      f"RMS {math.sqrt(sum(r * r for r in residuals) / len(residuals)):.1%} (log)")  # fmt: skip


def to_json(result: StepCostResult) -> dict[str, Any]:
    return {
        "points": [asdict(p) for p in result.points],
        "fit": None if result.fit is None else asdict(result.fit),
        "spread": result.spread,
    }


def fitted_profile(base: Profile, model: Fit, note: str) -> dict[str, Any]:
    """``base`` (an emulator profile) with the fitted step costs: its plain step's ``overhead_s`` and
    ``compute_s_per_token`` (the memory floor kept below one token's compute), ``draft_cost_ratio`` and
    ``verify_cost_ratio``; every other field (KV, acceptance, lengths) is the base's. A dictionary that
    :func:`backends.emulator.profiles.load_profile` reads back once written as YAML."""
    data = base.model_dump(mode="json", exclude_none=True)
    data["name"] = f"{base.name}-fitted"
    data["source"] = f"{note}; every other field from {base.name}"
    step = data["step"]
    step["overhead_s"] = round(model.overhead_s, 6)
    step["compute_s_per_token"] = round(max(model.per_token_s, 1e-6), 7)
    step["t_mem_s"] = min(step["t_mem_s"], step["compute_s_per_token"])
    data["speculative"]["draft_cost_ratio"] = round(min(model.draft_cost_ratio, 1.0), 4)
    data["speculative"]["verify_cost_ratio"] = round(min(model.verify_cost_ratio, 1.5), 4)
    return data
