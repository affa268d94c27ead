"""Recording a workload on a real speculative engine: per request its acceptance, natural length and timings.

Each prompt goes once to a vLLM server run with ``--per-request-spec-decode-metrics summary`` (the shipped
speculative manifests are), streamed with ``stream_options.include_usage``, greedy (temperature 0), without
``ignore_eos``, so the answer ends where the model ends it or at ``max_tokens`` (the item's, else a default).
vLLM puts the request's ``metrics.speculative_decoding`` in the usage chunk. Per item the recording keeps
``output_tokens`` (usage), ``finish_reason``, ``prompt_tokens``, ``ttft_ms`` (to the first content), ``e2e_ms``
(to the last byte), vLLM's numbers as they came (``spec``) and ``acceptance`` (below), and writes one
``provenance: recorded`` YAML file per category that :mod:`backends.workloads.loader` reads (its items keep
``acceptance`` and ``output_tokens`` as given) with a ``recording`` header: the command, the engine, the date,
the source.

**From vLLM's metrics to ``acceptance``.** The workloads' ``acceptance`` is Leviathan's per-token ``a`` of the
emulator's step model: every decode step drafts ``k`` tokens and yields ``E(a) = (1 - a^(k+1)) / (1 - a)``
tokens. vLLM counts only the verify steps that carried drafts (``num_spec_steps``); an n-gram drafter that
finds no match decodes a step with no draft, one token. So the decode steps of a request are its output
tokens less the first (from the prefill step) less the accepted drafts::

    steps = output_tokens - 1 - num_accepted_draft_tokens        (at least num_spec_steps)
    E     = (output_tokens - 1) / steps                          tokens per decode step, every step counted
    a     = E^-1(E; k)                                           bisection, clamped to [0.001, 0.999]

which gives the emulator's engine as many decode steps as the real one took (vLLM's ``mean_acceptance_length``,
drafted steps only, would overstate it where the drafter often has nothing to propose). A request with no
decode step (one output token) or without spec metrics has no acceptance: it is written with ``unmeasured``
and the loader leaves it out; the header counts them.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from backends.workloads.loader import Workload, WorkloadItem, load_category_file, load_workload
from backends.workloads.sources import SourcePrompt

DEFAULT_MAX_TOKENS = 256
ACCEPTANCE_FLOOR, ACCEPTANCE_CEILING = 0.001, 0.999  # the loader's acceptance is in (0, 1)


@dataclass(frozen=True)
class Prompt:
    """One request to record."""

    id: str
    category: str
    messages: tuple[Mapping[str, str], ...]
    max_tokens: int | None = None  # None: the recording's default
    task: str | None = None
    hard_case: str | None = None
    origin: str | None = None


@dataclass(frozen=True)
class Measurement:
    """What one request measured (``error`` set when it failed)."""

    output_tokens: int = 0
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    ttft_ms: float | None = None
    e2e_ms: float = 0.0
    spec: Mapping[str, Any] | None = None  # vLLM's metrics.speculative_decoding
    error: str | None = None


@dataclass(frozen=True)
class RecordConfig:
    url: str
    concurrency: int = 3
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    max_tokens_cap: int | None = None
    timeout_s: float = 600.0
    warmup: int = 1
    model: str | None = None


@dataclass
class Recorded:
    """A finished recording: each prompt with its measurement, in prompt order."""

    prompts: list[Prompt]
    measurements: list[Measurement]
    model: str
    k: int | None
    wall_s: float
    started: str
    vllm_version: str | None = None
    notes: dict[str, Any] = field(default_factory=dict)


def tokens_per_step(acceptance: float, k: int) -> float:
    """The emulator's expected tokens per speculative step, ``(1 - a^(k+1)) / (1 - a)``."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def per_token_acceptance(tokens: float, k: int) -> float:
    """The ``a`` whose :func:`tokens_per_step` is ``tokens`` (bisection), clamped into the loader's range."""
    if tokens <= 1.0:
        return ACCEPTANCE_FLOOR
    if tokens >= k + 1:
        return ACCEPTANCE_CEILING
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if tokens_per_step(middle, k) < tokens else (low, middle)
    return min(max((low + high) / 2, ACCEPTANCE_FLOOR), ACCEPTANCE_CEILING)


def acceptance_from_spec(spec: Mapping[str, Any] | None, output_tokens: int) -> tuple[float | None, str | None]:
    """(per-token acceptance, None), or (None, why there is none) for one request's vLLM metrics."""
    if not spec or not spec.get("num_spec_tokens"):
        return None, "no spec-decode metrics in the response"
    if output_tokens <= 1:
        return None, "one output token: no decode step"
    k, accepted = int(spec["num_spec_tokens"]), int(spec.get("num_accepted_draft_tokens") or 0)
    steps = max(output_tokens - 1 - accepted, int(spec.get("num_spec_steps") or 0), 1)
    return per_token_acceptance((output_tokens - 1) / steps, k), None


# --- the requests ---------------------------------------------------------------------------------------------


def request_body(prompt: Prompt, model: str, config: RecordConfig) -> dict[str, Any]:
    max_tokens = prompt.max_tokens or config.default_max_tokens
    if config.max_tokens_cap is not None:
        max_tokens = min(max_tokens, config.max_tokens_cap)
    return {
        "model": model,
        "messages": [dict(m) for m in prompt.messages],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def measure(client: httpx.AsyncClient, url: str, body: Mapping[str, Any]) -> Measurement:
    """One streamed chat completion, timed; usage, finish reason and spec metrics read from its events."""
    started = time.perf_counter()
    ttft: float | None = None
    found: dict[str, Any] = {}
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                return Measurement(error=f"HTTP {response.status_code}: {text[:300]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = orjson.loads(line[6:])
                if ttft is None and _has_content(event):
                    ttft = time.perf_counter() - started
                _note(event, found)
    except httpx.HTTPError as exc:
        return Measurement(error=f"{type(exc).__name__}: {exc}")
    e2e = time.perf_counter() - started
    usage = found.get("usage") or {}
    if "error" in found or not usage:
        return Measurement(error=str(found.get("error") or "no usage in the stream"))
    return Measurement(
        output_tokens=int(usage.get("completion_tokens") or 0), prompt_tokens=usage.get("prompt_tokens"),
        finish_reason=found.get("finish_reason"), ttft_ms=None if ttft is None else round(ttft * 1e3, 1),
        e2e_ms=round(e2e * 1e3, 1), spec=found.get("spec"),
    )  # fmt: skip


def _has_content(event: Mapping[str, Any]) -> bool:
    return any((c.get("delta") or {}).get("content") for c in event.get("choices") or [])


def _note(event: Mapping[str, Any], found: dict[str, Any]) -> None:
    for choice in event.get("choices") or []:
        if choice.get("finish_reason"):
            found["finish_reason"] = choice["finish_reason"]
    if event.get("usage"):
        found["usage"] = event["usage"]
    spec = (event.get("metrics") or {}).get("speculative_decoding")
    if spec:
        found["spec"] = spec
    if event.get("error"):
        found["error"] = event["error"]


async def _record(prompts: Sequence[Prompt], config: RecordConfig,
                  progress: Callable[[int, int], None] | None) -> Recorded:  # fmt: skip
    limits = httpx.Limits(max_connections=config.concurrency + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s, connect=10.0), limits=limits) as client:
        model = config.model or (await client.get(f"{config.url}/v1/models")).json()["data"][0]["id"]
        version = await _version(client, config.url)
        for prompt in prompts[: config.warmup]:  # not recorded: the first request pays for a cold engine
            await measure(client, config.url, request_body(prompt, model, config))
        gate, done = asyncio.Semaphore(config.concurrency), 0
        started, clock = datetime.now(UTC).isoformat(timespec="seconds"), time.perf_counter()

        async def one(prompt: Prompt) -> Measurement:
            nonlocal done
            async with gate:
                result = await measure(client, config.url, request_body(prompt, model, config))
            done += 1
            if progress is not None:
                progress(done, len(prompts))
            return result

        measurements = list(await asyncio.gather(*(one(p) for p in prompts)))
    ks = {int(m.spec["num_spec_tokens"]) for m in measurements if m.spec and m.spec.get("num_spec_tokens")}
    return Recorded(list(prompts), measurements, model, max(ks) if ks else None, time.perf_counter() - clock,
                    started, version)  # fmt: skip


async def _version(client: httpx.AsyncClient, url: str) -> str | None:
    try:
        response = await client.get(f"{url}/version")
        return str(response.json().get("version")) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def record(prompts: Sequence[Prompt], config: RecordConfig,
           progress: Callable[[int, int], None] | None = None) -> Recorded:  # fmt: skip
    """Send every prompt once (at most ``config.concurrency`` at a time) and measure it."""
    return asyncio.run(_record(prompts, config, progress))


# --- the prompts ------------------------------------------------------------------------------------------------


def from_workload(workload: Workload) -> list[Prompt]:
    """A workload's items as prompts, with their ids, categories, tasks and max_tokens."""
    return [_from_item(item) for item in workload.items]


def _from_item(item: WorkloadItem) -> Prompt:
    return Prompt(item.id, item.category, item.messages, item.max_tokens, item.task, item.hard_case)


def load_prompts(paths: Iterable[Path]) -> list[Prompt]:
    """The items of workload files or directories of them, in file order."""
    files = sorted(f for p in paths for f in (sorted(p.glob("*.yaml")) if p.is_dir() else [p]))
    return from_workload(load_workload(files))


def from_source(prompts: Iterable[SourcePrompt], category: str, task: str) -> list[Prompt]:
    return [Prompt(p.id, category, ({"role": "user", "content": p.user},), None, task, None, p.origin)
            for p in prompts]  # fmt: skip


# --- the files --------------------------------------------------------------------------------------------------


def item_entry(prompt: Prompt, result: Measurement, config: RecordConfig) -> dict[str, Any]:
    """One recorded item as the loader's ``ItemSpec`` reads it."""
    entry: dict[str, Any] = {"id": prompt.id}
    if prompt.origin:
        entry["origin"] = prompt.origin
    if prompt.task:
        entry["task"] = prompt.task
    if prompt.hard_case:
        entry["hard_case"] = prompt.hard_case
    entry["max_tokens"] = request_body(prompt, "", config)["max_tokens"]
    entry.update(_message_fields(prompt.messages))
    acceptance, why = acceptance_from_spec(result.spec, result.output_tokens)
    if acceptance is not None:
        entry["acceptance"] = round(acceptance, 4)
    else:
        entry["unmeasured"] = why
    entry["output_tokens"] = result.output_tokens
    entry["finish_reason"] = result.finish_reason
    entry["prompt_tokens"] = result.prompt_tokens
    entry["ttft_ms"] = result.ttft_ms
    entry["e2e_ms"] = result.e2e_ms
    if result.spec:
        entry["spec"] = {
            "mean_acceptance_length": round(float(result.spec["mean_acceptance_length"]), 4),
            "draft_acceptance_rate": round(float(result.spec["draft_acceptance_rate"]), 4),
            "steps": int(result.spec["num_spec_steps"]),
            "drafted": int(result.spec["num_draft_tokens"]),
            "accepted": int(result.spec["num_accepted_draft_tokens"]),
        }
    return {key: value for key, value in entry.items() if value is not None}


def _message_fields(messages: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    roles = [m["role"] for m in messages]
    if roles == ["user"]:
        return {"user": messages[0]["content"]}
    if roles == ["system", "user"]:
        return {"system": messages[0]["content"], "user": messages[1]["content"]}
    return {"messages": [{"role": m["role"], "content": m["content"]} for m in messages]}


def summary(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Items, measured, mean acceptance, median output tokens, share cut by max_tokens, mean draft rate."""
    measured = [e["acceptance"] for e in entries if "acceptance" in e]
    rates = [e["spec"]["draft_acceptance_rate"] for e in entries if "spec" in e]
    return {
        "items": len(entries),
        "unmeasured": len(entries) - len(measured),
        "mean_acceptance": round(statistics.fmean(measured), 3) if measured else None,
        "median_output_tokens": statistics.median(e["output_tokens"] for e in entries) if entries else None,
        "finished_by_length": round(sum(e.get("finish_reason") == "length" for e in entries) / len(entries), 3)
        if entries else None,
        "mean_draft_acceptance_rate": round(statistics.fmean(rates), 3) if rates else None,
    }  # fmt: skip


def write_recording(recorded: Recorded, config: RecordConfig, out: Path, command: str,
                    engine: Mapping[str, Any], source: Mapping[str, Any] | None = None) -> list[Path]:  # fmt: skip
    """One ``<category>.yaml`` per category under ``out``; failed requests are left out and counted."""
    out.mkdir(parents=True, exist_ok=True)
    by_category: dict[str, list[dict[str, Any]]] = {}
    failed: list[dict[str, str]] = []
    tasks: dict[str, set[str | None]] = {}
    for prompt, result in zip(recorded.prompts, recorded.measurements, strict=True):
        if result.error is not None:
            failed.append({"id": prompt.id, "error": result.error})
            continue
        by_category.setdefault(prompt.category, []).append(item_entry(prompt, result, config))
        tasks.setdefault(prompt.category, set()).add(prompt.task)
    engine_info = {"vllm": recorded.vllm_version, "model": recorded.model, "num_speculative_tokens": recorded.k,
                   **engine}  # fmt: skip
    settings = {"temperature": 0, "ignore_eos": False, "stream": True, "concurrency": config.concurrency,
                "max_tokens": f"the item's, else {config.default_max_tokens}"
                + (f", at most {config.max_tokens_cap}" if config.max_tokens_cap else ""),
                "warmup_requests": config.warmup, "wall_s": round(recorded.wall_s, 1),
                "failed": failed}  # fmt: skip
    paths = []
    for category, entries in sorted(by_category.items()):
        only = tasks[category]
        header: dict[str, Any] = {"category": category, "provenance": "recorded"}
        if len(only) == 1 and None not in only:  # one task for the whole file: say it once
            header["task"] = next(iter(only))
            for entry in entries:
                entry.pop("task", None)
        header["source"] = f"recorded by `{command}` on {recorded.started}"
        header["recording"] = {"command": command, "date": recorded.started, "engine": engine_info,
                               "source": dict(source) if source else None, "settings": settings,
                               "summary": summary(entries)}  # fmt: skip
        path = out / f"{category}.yaml"
        path.write_text(dump_yaml({**header, "items": entries}), encoding="utf-8")
        load_category_file(path)  # what we wrote must load
        paths.append(path)
    return paths


class _Dumper(yaml.SafeDumper):
    pass


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _text)


def dump_yaml(data: Mapping[str, Any]) -> str:
    """YAML with multi-line texts as literal blocks (readable prompts), keys in the order given."""
    return yaml.dump(dict(data), Dumper=_Dumper, allow_unicode=True, sort_keys=False, width=1_000_000)
