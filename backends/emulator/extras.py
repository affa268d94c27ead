"""The emulator's other vLLM endpoints: ``/tokenize``, ``/detokenize``, ``/v1/embeddings``, ``/version``.

Shapes are vLLM 0.32's; contents are EMULATED: a token is one UTF-8 byte (id = the byte's value), so every
emulator agrees on ids and ``/detokenize`` inverts ``/tokenize`` on any of them; embeddings are deterministic
pseudo-random unit vectors seeded by a hash of the text (equal texts, equal vectors), not a model's.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import re
import struct
import time
import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from backends.emulator import openai_io as io
from backends.workloads.loader import content_text

VLLM_VERSION = "0.32.0"
EMBEDDING_DIM = 64
_PIECE = re.compile(r"\s*(?:[\u3400-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]|\w+|[^\w\s])")


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(tokens: list[int]) -> str:
    if any(not 0 <= t < 256 for t in tokens):
        raise io.RequestError(400, "token id out of range: the emulator's tokens are bytes (0..255)", "tokens")
    return bytes(tokens).decode("utf-8", "replace")


def tokenize(raw: bytes, served_model: str, max_model_len: int) -> bytes:
    body = _checked(raw, served_model)
    prompt, messages = body.get("prompt"), body.get("messages")
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
        text = "\n".join(f"{m.get('role', '')}: {content_text(m.get('content'))}" for m in messages)
    else:
        raise io.RequestError(400, "either 'prompt' (a string) or 'messages' is required", "prompt")
    tokens = encode(text)
    strs = [decode([t]) for t in tokens] if body.get("return_token_strs") else None
    return orjson.dumps({"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens, "token_strs": strs})


def detokenize(raw: bytes, served_model: str) -> bytes:
    tokens = _checked(raw, served_model).get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise io.RequestError(400, "'tokens' must be a list of integers", "tokens")
    return orjson.dumps({"prompt": decode(tokens)})


def embeddings(raw: bytes, served_model: str) -> bytes:
    body = _checked(raw, served_model)
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise io.RequestError(400, "'input' must be a string or a non-empty list of strings", "input")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise io.RequestError(400, "'encoding_format' must be 'float' or 'base64'", "encoding_format")
    data = [
        {"index": i, "object": "embedding", "embedding": _encoded(fake_vector(text), encoding)}
        for i, text in enumerate(texts)
    ]
    tokens = sum(len(_PIECE.findall(text)) for text in texts)
    return orjson.dumps(
        {
            "id": f"embd-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": served_model,
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
        }
    )


def version() -> bytes:
    return orjson.dumps({"version": VLLM_VERSION, "emulated": True})


def fake_vector(text: str, dim: int = EMBEDDING_DIM) -> list[float]:
    """A unit vector drawn from a generator seeded by the text's hash (EMULATED, carries no meaning)."""
    rng = random.Random(hashlib.sha256(text.encode()).digest())
    vector = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _checked(raw: bytes, served_model: str) -> Mapping[str, Any]:
    body = io.json_object(raw)
    model = body.get("model")
    if model is not None and model != served_model:
        raise io.RequestError(404, f"The model `{model}` does not exist.", "model")
    return body
