"""``specgate bench sessions``' figures: per phase, the first turns' and the later turns' time to first token,
the later turns' end-to-end time, where the turns went and how many moved, the engines' prefix-cache hit rate;
cache-aware over cache-blind; rich tables and JSON."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from gateway.bench.compare import percentile
from gateway.bench.sessions import PHASES, POOLS, CacheCounters, PhaseRun, SessionsResult, TurnOutcome

TARGET = 0.70  # issue 29: TTFT of turns >= 2 at least 30 % lower cache-aware than cache-blind


@dataclass(frozen=True)
class PhaseSummary:
    phase: str
    conversations: int  # conversation runs (over all passes)
    turns: int
    ttft_first_p50: float | None
    ttft_first_p95: float | None
    ttft_later_p50: float | None
    ttft_later_p95: float | None
    e2e_later_mean: float | None
    prompt_later_mean: float | None  # prompt tokens of the later turns (the engine's usage)
    requests: dict[str, int]  # per pool (as the gateway's x-specgate-pool said)
    later: int  # turns >= 2 answered
    moved: int  # of those, sent to another pool than the same conversation's previous turn
    hit_rate: dict[str, float | None]  # per pool and "all": the engine's hits / queries over the phase's runs
    errors: int


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def moves(runs: Sequence[PhaseRun]) -> tuple[int, int]:
    """(later turns answered, those whose pool differs from the previous turn's of the same conversation)."""
    later = moved = 0
    for run in runs:
        previous: dict[str, str] = {}
        for outcome in sorted(run.outcomes, key=lambda o: (o.conversation, o.turn)):
            if outcome.turn > 1 and outcome.error is None and outcome.conversation in previous:
                later += 1
                moved += outcome.pool != previous[outcome.conversation]
            previous[outcome.conversation] = outcome.pool
    return later, moved


def hit_rates(runs: Sequence[PhaseRun]) -> dict[str, float | None]:
    """The engines' prefix-cache hits over queries (tokens) summed over the runs, per pool and over both."""
    sums = {name: CacheCounters(0.0, 0.0) for name in (*POOLS, "all")}
    for run in runs:
        for name, rise in run.cache.items():
            if rise is not None:
                for key in (name, "all"):
                    sums[key] = CacheCounters(sums[key].queries + rise.queries, sums[key].hits + rise.hits)
    return {name: (s.hits / s.queries if s.queries > 0 else None) for name, s in sums.items()}


def summarize(result: SessionsResult, phase: str) -> PhaseSummary:
    runs = [run for run in result.runs if run.phase == phase]
    outcomes = [o for run in runs for o in run.outcomes]
    ok = [o for o in outcomes if o.error is None]
    first = [o.ttft_s for o in ok if o.turn == 1 and o.ttft_s is not None]
    later_ok = [o for o in ok if o.turn > 1]
    later_ttft = [o.ttft_s for o in later_ok if o.ttft_s is not None]
    prompts = [float(o.prompt_tokens) for o in later_ok if o.prompt_tokens is not None]
    later, moved = moves(runs)
    return PhaseSummary(
        phase=phase,
        conversations=len({(run.round, o.conversation) for run in runs for o in run.outcomes}),
        turns=len(outcomes),
        ttft_first_p50=percentile(first, 50), ttft_first_p95=percentile(first, 95),
        ttft_later_p50=percentile(later_ttft, 50), ttft_later_p95=percentile(later_ttft, 95),
        e2e_later_mean=_mean([o.e2e_s for o in later_ok]),
        prompt_later_mean=_mean(prompts),
        requests={pool: sum(o.pool == pool for o in ok) for pool in POOLS},
        later=later, moved=moved, hit_rate=hit_rates(runs), errors=len(outcomes) - len(ok),
    )  # fmt: skip


def ratios(result: SessionsResult) -> dict[str, float | None]:
    """Cache-aware over cache-blind, turns >= 2: TTFT p50 and p95, mean end to end."""
    aware, blind = summarize(result, "cache-aware"), summarize(result, "cache-blind")

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    return {
        "ttft_later_p50": ratio(aware.ttft_later_p50, blind.ttft_later_p50),
        "ttft_later_p95": ratio(aware.ttft_later_p95, blind.ttft_later_p95),
        "e2e_later_mean": ratio(aware.e2e_later_mean, blind.e2e_later_mean),
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def report(result: SessionsResult, console: Console) -> None:
    passes = len({run.round for run in result.runs})
    table = Table(title=f"specgate bench sessions: real pools ({result.model}), {passes} pass(es); TTFT in ms, "
                        "end to end in s (client-measured, through the gateway); engine hit rate: vLLM's prefix-cache "
                        "hits / queries over the phase")  # fmt: skip
    columns = ("phase", "convs", "turns", "TTFT t1 p50", "t1 p95", "TTFT t>=2 p50", "t>=2 p95", "E2E t>=2 mean",
               "prompt tok t>=2", "std / spec req", "moved", "hit std", "hit spec", "hit all", "errors")
    for column in columns:
        table.add_column(column, justify="left" if column == "phase" else "right")
    for phase in PHASES:
        s = summarize(result, phase)
        table.add_row(
            phase, str(s.conversations), str(s.turns), _ms(s.ttft_first_p50), _ms(s.ttft_first_p95),
            _ms(s.ttft_later_p50), _ms(s.ttft_later_p95),
            "-" if s.e2e_later_mean is None else f"{s.e2e_later_mean:.3f}",
            "-" if s.prompt_later_mean is None else f"{s.prompt_later_mean:.0f}",
            f"{s.requests['standard']} / {s.requests['speculative']}", f"{s.moved} of {s.later}",
            _share(s.hit_rate["standard"]), _share(s.hit_rate["speculative"]), _share(s.hit_rate["all"]),
            str(s.errors), style="bold" if phase == "cache-aware" else None,
        )  # fmt: skip
    console.print(table)
    console.print(_by_category(result))
    r = ratios(result)
    fmt = {key: "-" if value is None else f"{value:.2f}x" for key, value in r.items()}
    met = r["ttft_later_p50"] is not None and r["ttft_later_p50"] <= TARGET
    console.print(
        f"cache-aware / cache-blind, turns >= 2: TTFT p50 {fmt['ttft_later_p50']}, p95 {fmt['ttft_later_p95']}, "
        f"mean end to end {fmt['e2e_later_mean']} (target: TTFT p50 <= {TARGET:.2f}x: "
        f"{'met' if met else 'not met'})"
    )


def _by_category(result: SessionsResult) -> Table:
    table = Table(title="TTFT p50 of turns >= 2 per session file (ms)")
    table.add_column("category", justify="left")
    for phase in PHASES:
        table.add_column(phase, justify="right")
    categories = sorted({o.category for run in result.runs for o in run.outcomes})
    for category in categories:
        row = []
        for phase in PHASES:
            values = [o.ttft_s for o in result.outcomes(phase) if o.category == category and o.turn > 1
                      and o.error is None and o.ttft_s is not None]  # fmt: skip
            row.append(_ms(percentile(values, 50)))
        table.add_row(category, *row)
    return table


def _outcome(run: PhaseRun, outcome: TurnOutcome) -> dict[str, Any]:
    return {"phase": run.phase, "round": run.round, **asdict(outcome)}


def to_json(result: SessionsResult) -> dict[str, Any]:
    return {
        "model": result.model,
        "phases": {phase: asdict(summarize(result, phase)) for phase in PHASES},
        "aware_over_blind": ratios(result),
        "target_ttft_later_p50": TARGET,
        "runs": [
            {
                "phase": run.phase, "round": run.round, "nonce": run.nonce, "seconds": run.seconds,
                "cache": {name: None if c is None else asdict(c) for name, c in run.cache.items()},
            }
            for run in result.runs
        ],
        "outcomes": [_outcome(run, o) for run in result.runs for o in run.outcomes],
    }  # fmt: skip


def write_json(path: Path, result: SessionsResult) -> None:
    path.write_bytes(orjson.dumps(to_json(result), option=orjson.OPT_INDENT_2))
