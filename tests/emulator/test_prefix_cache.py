"""The prefix cache (backends/emulator/prefix_cache.py), its use by the engine (timing.py) and the prompt's
block hashes from text (prompt_blocks.py)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from backends.emulator.prefix_cache import BLOCK_SIZE, PrefixCache, chain_hashes
from backends.emulator.profiles import Profile, load_profile
from backends.emulator.prompt_blocks import chat_blocks, chat_tokens, completion_blocks
from backends.emulator.timing import Engine, EngineRequest, TimingModel
from backends.workloads.loader import count_prompt_tokens, count_tokens

# --- the cache on its own ------------------------------------------------------------------------------------


def test_lookup_counts_leading_blocks_and_stops_at_the_first_miss() -> None:
    cache = PrefixCache()
    cache.acquire([1, 2, 3])
    cache.release([1, 2, 3])
    assert cache.lookup([1, 2, 3, 4], limit=10) == 3
    assert cache.lookup([1, 9, 3], limit=10) == 1  # block 3 is held, but not behind a hit
    assert cache.lookup([1, 2, 3], limit=2) == 2


def test_shared_blocks_are_counted_once_and_freed_when_the_last_user_goes() -> None:
    cache = PrefixCache()
    cache.acquire([1, 2])
    cache.acquire([1, 2, 3])
    assert (cache.pinned_blocks, cache.free_blocks) == (3, 0)
    cache.release([1, 2, 3])
    assert (cache.pinned_blocks, cache.free_blocks) == (2, 1)
    assert cache.evict(5) == 1 and 3 not in cache  # only the free block can go
    cache.release([1, 2])
    assert (cache.pinned_blocks, cache.free_blocks) == (0, 2)


def test_eviction_is_least_recently_freed_first_and_a_prompt_tail_before_its_head() -> None:
    cache = PrefixCache()
    for blocks in ([1, 2, 3], [7, 8]):
        cache.acquire(blocks)
    cache.release([1, 2, 3])  # freed first: 3, then 2, then 1
    cache.release([7, 8])
    cache.evict(2)
    assert [block in cache for block in (1, 2, 3, 7, 8)] == [True, False, False, True, True]
    cache.acquire([1])  # a hit pins it again: no longer evictable
    cache.evict(10)
    assert 1 in cache and 7 not in cache and cache.evictions == 4


def test_chain_hashes_cover_the_whole_prefix_and_skip_a_partial_block() -> None:
    tokens = [f"t{i}" for i in range(40)]
    hashes = chain_hashes(tokens)
    assert len(hashes) == 2  # 40 tokens: two full blocks of 16, the last 8 not hashed
    changed = chain_hashes(["x", *tokens[1:]])
    assert changed[0] != hashes[0] and changed[1] != hashes[1]  # a change in block 0 moves every later hash
    assert chain_hashes(tokens[:32] + ["other"] * 8) == hashes


def test_block_hashes_are_the_same_in_another_process() -> None:
    code = "from backends.emulator.prefix_cache import chain_hashes; print(chain_hashes([str(i) for i in range(32)]))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert other.strip() == str(chain_hashes([str(i) for i in range(32)]))


# --- the prompt's blocks from its text ------------------------------------------------------------------------

SYSTEM = "You are a careful assistant for a logistics company. " * 6
CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is parcel 4417?"}]


@pytest.mark.parametrize("continue_final", [False, True], ids=["answer", "continue-final"])
def test_a_chat_renders_to_exactly_its_prompt_tokens(continue_final: bool) -> None:
    messages = [*CHAT, {"role": "assistant", "content": "It left the depot at 9:40 and"}]
    tokens = chat_tokens(messages, continue_final)
    closed = messages[:-1] if continue_final else messages
    extra = count_tokens(str(messages[-1]["content"])) if continue_final else 0
    assert len(tokens) == count_prompt_tokens(closed) + extra
    assert len(chat_blocks(messages, continue_final)) == len(tokens) // BLOCK_SIZE


def test_a_completion_renders_to_its_prompt_tokens() -> None:
    prompt = "def parse(line):\n    return line.split(',')  # " * 5
    assert len(completion_blocks(prompt)) == (count_tokens(prompt) + 1) // BLOCK_SIZE


def test_the_next_turn_of_a_conversation_starts_with_the_previous_turns_blocks() -> None:
    first = chat_blocks(CHAT)
    second = chat_blocks([*CHAT, {"role": "assistant", "content": "In Lyon."}, {"role": "user", "content": "And?"}])
    assert len(first) >= 4 and second[: len(first)] == first


def test_two_questions_under_one_system_prompt_share_the_system_prompts_full_blocks_only() -> None:
    first = [CHAT[0], {"role": "user", "content": "Where is parcel 4417? It was due on Monday. " * 4}]
    second = [CHAT[0], {"role": "user", "content": "Cancel order 12 and refund the card, please. " * 4}]
    # the common tokens: the system message and the next message's opening (<|im_start|> user \n)
    shared = len(chat_tokens(CHAT[:1])) - 2 + 3
    assert chat_tokens(first)[:shared] == chat_tokens(second)[:shared]
    assert chat_tokens(first)[shared] != chat_tokens(second)[shared]
    one, other = chat_blocks(first), chat_blocks(second)
    common = next(i for i, (a, b) in enumerate(zip(one, other, strict=True)) if a != b)
    assert common == shared // BLOCK_SIZE and len(one) > common + 1


# --- the engine with the cache --------------------------------------------------------------------------------


def _profile(**changes: object) -> Profile:
    return load_profile("h100-8b").model_copy(update=changes)


def _tokens(count: int, tag: str = "p") -> list[str]:
    return [f"{tag}{i}" for i in range(count)]


def _request(name: str, tokens: list[str], output: int = 4, hashes: bool = True) -> EngineRequest:
    return EngineRequest(name, prompt_tokens=len(tokens), output_tokens=output, acceptance=0.5,
                         block_hashes=chain_hashes(tokens) if hashes else None)  # fmt: skip


def _first_step_s(engine: Engine, request: EngineRequest) -> float:
    engine.add(request)
    duration = engine.step().duration_s
    while engine.has_work:
        engine.step()
    return duration


def test_a_second_identical_prompt_prefills_faster_and_counts_hits() -> None:
    profile = _profile()
    engine = Engine(TimingModel(profile, False), random.Random(0))
    prompt = _tokens(1000)
    cold = _first_step_s(engine, _request("a", prompt))
    warm = _first_step_s(engine, _request("b", prompt))
    cached = (1000 - 1) // BLOCK_SIZE * BLOCK_SIZE  # 992: vLLM always computes the last prompt token
    assert cold - warm == pytest.approx(profile.step.prefill_s_per_token * cached)
    counters = engine.counters
    assert (counters.prefix_cache_queries, counters.prefix_cache_hits) == (2000, cached)
    assert counters.prompt_tokens == 2000  # vLLM's prompt_tokens counts cached tokens too


def test_a_shared_system_prompt_hits_for_its_blocks_only() -> None:
    engine = Engine(TimingModel(_profile(), False), random.Random(0))
    system = _tokens(100, "sys")
    _first_step_s(engine, _request("a", system + _tokens(60, "q1-")))
    _first_step_s(engine, _request("b", system + _tokens(60, "q2-")))
    assert engine.counters.prefix_cache_hits == 100 // BLOCK_SIZE * BLOCK_SIZE  # 96: six full blocks


def test_without_block_hashes_nothing_is_looked_up_or_cached() -> None:
    engine = Engine(TimingModel(_profile(), False), random.Random(0))
    prompt = _tokens(500)
    first = _first_step_s(engine, _request("a", prompt, hashes=False))
    second = _first_step_s(engine, _request("b", prompt, hashes=False))
    assert first == second
    assert (engine.counters.prefix_cache_queries, engine.cache.pinned_blocks + engine.cache.free_blocks) == (0, 0)


def test_a_short_prompt_is_a_query_with_nothing_to_hit() -> None:
    engine = Engine(TimingModel(_profile(), False), random.Random(0))
    _first_step_s(engine, _request("a", _tokens(10)))
    _first_step_s(engine, _request("b", _tokens(10)))
    assert (engine.counters.prefix_cache_queries, engine.counters.prefix_cache_hits) == (20, 0)


def test_requests_running_together_share_their_prefix_in_the_kv_cache() -> None:
    engine = Engine(TimingModel(_profile(), False), random.Random(0))
    system = _tokens(320, "sys")  # 20 blocks
    for index in range(3):
        engine.add(_request(str(index), system + _tokens(20, f"q{index}-"), output=50))
    engine.step()
    assert engine.num_running == 3
    separate = sum(340 + 1 for _ in range(3))  # what three unshared prompts would hold (each has its first token)
    assert engine.kv_usage * engine.model.profile.kv_capacity_tokens == separate - 2 * 320
    assert engine.counters.prefix_cache_hits == 2 * 320  # the second and third hit in the same step


def test_under_kv_pressure_free_blocks_go_least_recently_used_first() -> None:
    engine = Engine(TimingModel(_profile(kv_capacity_tokens=8192, max_model_len=8192), False), random.Random(0))
    old, recent = _tokens(3200, "old"), _tokens(3200, "new")  # 200 blocks each
    _first_step_s(engine, _request("old", old))
    _first_step_s(engine, _request("recent", recent))
    assert engine.cache.free_blocks == 400  # both kept while the KV cache has room
    _first_step_s(engine, _request("big", _tokens(3000, "big"), output=200))  # needs ~200 blocks back
    kept_recent = engine.cache.lookup(chain_hashes(recent), 1000)
    kept_old = engine.cache.lookup(chain_hashes(old), 1000)
    assert kept_recent == 200 and kept_old < 200
    assert engine.cache.evictions > 0


def test_blocks_of_running_requests_are_never_evicted() -> None:
    engine = Engine(TimingModel(_profile(kv_capacity_tokens=8192, max_model_len=8192), False), random.Random(0))
    running = _tokens(4000, "run")  # 250 blocks, pinned while it decodes
    engine.add(_request("long", running, output=3000))
    engine.step()
    _first_step_s(engine, _request("filler", _tokens(3500, "fill"), output=1))
    while engine.has_work:  # the long request grows past what is left: free blocks go, its own stay
        engine.step()
        if engine.num_running:
            assert engine.cache.lookup(chain_hashes(running), 1000) == 250
    assert engine.counters.preemptions == 0 and engine.cache.evictions > 0


def test_a_preempted_request_is_queried_once_and_recomputes_from_its_cached_prefix() -> None:
    profile = _profile(kv_capacity_tokens=600, max_model_len=600)
    engine = Engine(TimingModel(profile, False), random.Random(0))
    for index in range(2):
        engine.add(_request(str(index), _tokens(160, f"r{index}-"), output=250))
    while engine.has_work:
        engine.step()
    assert engine.counters.preemptions > 0
    assert engine.counters.prefix_cache_queries == 2 * 160
    assert engine.counters.generation_tokens == 500


@pytest.mark.parametrize("answer_hashes", [True, False], ids=["answer-sent", "prompt-only"])
def test_a_finished_answer_stays_cached_where_its_hashes_were_sent(answer_hashes: bool) -> None:
    """A next turn resends the answer: with the answer's block hashes sent (past the prompt's) it hits them, as
    on vLLM; with the prompt's only, it hits up to the end of the previous prompt, as before."""
    engine = Engine(TimingModel(_profile(), False), random.Random(0))
    prompt, answer = _tokens(200, "q"), _tokens(100, "a")
    sent = chain_hashes(prompt + answer) if answer_hashes else chain_hashes(prompt)
    first = EngineRequest("1", prompt_tokens=200, output_tokens=100, acceptance=0.5, block_hashes=sent)
    _first_step_s(engine, first)
    assert engine.cache.pinned_blocks == 0  # everything handed back, free
    assert engine.cache.free_blocks == (300 // BLOCK_SIZE if answer_hashes else 200 // BLOCK_SIZE)
    _first_step_s(engine, _request("2", prompt + answer + _tokens(30, "n")))
    assert engine.counters.prefix_cache_hits - 192 == (288 - 192 if answer_hashes else 0)  # 18 blocks or 12
    # the answer's blocks were freed before the prompt's: the first evicted
    if answer_hashes:
        fresh = Engine(TimingModel(_profile(), False), random.Random(0))
        _first_step_s(fresh, EngineRequest("1", prompt_tokens=200, output_tokens=100, acceptance=0.5,
                                           block_hashes=sent))  # fmt: skip
        fresh.cache.evict(6)
        assert fresh.cache.lookup(sent, 100) == 12  # the prompt's twelve full blocks are left
