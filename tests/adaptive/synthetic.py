"""Synthetic requests whose acceptance follows their content, not their task's name: one system prompt for
everything; a request that asks to transform a pasted passage (rewrite, fix, translate it) is answered
mostly by copying (high acceptance), one that asks for new text (a story, ideas, an explanation) is not.
Topics and phrasings are split so that a test can ask about requests unlike any it learned from."""

from __future__ import annotations

import random
from dataclasses import dataclass

SYSTEM = "You are a helpful assistant."
TOPICS = (
    "the ocean", "a small bakery", "machine learning", "the history of Rome", "a rainy day", "space travel",
    "gardening", "a chess match", "the stock market", "an old lighthouse", "city traffic", "a lost cat",
    "mountain hiking", "quantum computers", "a village wedding", "coffee farming", "jazz music", "volcanoes",
)  # fmt: skip
SENTENCES = (
    "The {t} was quiet in the morning and nobody expected anything to change.",
    "Many people think about {t} differently after they learn more about it.",
    "In the report, the committee described {t} with great detail and some doubt.",
    "She wrote a long letter about {t}, full of small observations and jokes.",
)
TRANSFORM = (
    "Rewrite the following paragraph in a more formal tone:",
    "Fix the grammar in this text:",
    "Polish the passage below without changing its meaning:",
    "Edit this text so that it reads better:",
    "Correct the spelling mistakes in the following text:",
)
NEW = (
    "Write a short story about {t}.",
    "Give me five creative ideas about {t}.",
    "Explain {t} to a ten year old.",
    "Write a poem about {t}.",
    "Describe {t} in your own words.",
)
ZH_TRANSFORM = ("请把下面这段话改写得更正式：", "帮我修改下面这段文字的语法错误：")
ZH_NEW = ("写一个关于{t}的小故事。", "给我五个关于{t}的创意。")
ZH_TOPICS = ("大海", "面包店", "机器学习", "下雨天", "太空旅行", "园艺")
HIGH, LOW = (0.85, 0.95), (0.35, 0.50)  # per-token acceptance of a transform and of new text


@dataclass(frozen=True, slots=True)
class Request:
    user: str
    transform: bool
    acceptance: float  # per-token
    output_tokens: int


def request(rng: random.Random, transform: bool, topics: tuple[str, ...], phrasings: tuple[str, ...]) -> Request:
    topic = rng.choice(topics)
    if transform:
        passage = " ".join(rng.choice(SENTENCES).format(t=topic) for _ in range(rng.randint(3, 8)))
        return Request(f"{rng.choice(phrasings)}\n\n{passage}", True, rng.uniform(*HIGH), len(passage) // 4)
    return Request(rng.choice(phrasings).format(t=topic), False, rng.uniform(*LOW), rng.randint(150, 400))


def zh_request(rng: random.Random, transform: bool) -> Request:
    topic = rng.choice(ZH_TOPICS)
    if transform:
        passage = f"今天我们讨论了{topic}，大家都觉得这个问题很有意思，但是还需要更多的时间来研究。" * rng.randint(2, 4)
        return Request(f"{rng.choice(ZH_TRANSFORM)}\n\n{passage}", True, rng.uniform(*HIGH), len(passage))
    return Request(rng.choice(ZH_NEW).format(t=topic), False, rng.uniform(*LOW), rng.randint(150, 400))


def learned(rng: random.Random) -> Request:
    """From the first 12 topics and the first three phrasings of each kind."""
    transform = rng.random() < 0.5
    return request(rng, transform, TOPICS[:12], (TRANSFORM if transform else NEW)[:3])


def unseen(rng: random.Random) -> Request:
    """From the other topics, and phrasings half of which were never learned."""
    transform = rng.random() < 0.5
    return request(rng, transform, TOPICS[12:], (TRANSFORM if transform else NEW)[2:])


def tokens_per_step(rate: float, k: int = 5) -> float:
    return (1.0 - rate ** (k + 1)) / (1.0 - rate)
