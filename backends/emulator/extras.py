"""The emulator's other vLLM endpoints: ``/tokenize``, ``/detokenize``, ``/v1/embeddings``, ``/version``.

Shapes are vLLM 0.32's; contents are EMULATED. The tokenizer cuts text into pieces (a word, a CJK character
or a punctuation mark, with the whitespace before it, as the emulator counts prompts); a piece in its fixed
vocabulary (every piece its answers are made of, :data:`text.PIECES`, and ChatML's markers) is one token, id
256 and up; any other piece is one token per UTF-8 byte (id = the byte's value), as a byte-level BPE falls
back to bytes. So ``/tokenize`` counts an answer's text as exactly the tokens its stream emitted, and a chat
made of the vocabulary's words as the prompt tokens its usage reports; every emulator agrees on ids, and
``/detokenize`` inverts ``/tokenize``. Embeddings are deterministic pseudo-random unit vectors seeded by a
hash of the text (equal texts, equal vectors), not a model's.
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
from backends.emulator.text import PIECES
from backends.workloads.loader import content_text

VLLM_VERSION = "0.32.0"
EMBEDDING_DIM = 64
_WORD = r"[\u3400-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]|\w+|[^\w\s]"
_PIECE = re.compile(rf"\s*(?:{_WORD})")
_TOKEN_PIECE = re.compile(rf"\s*(?:{_WORD})|\s+")  # trailing whitespace is a piece of its own
# ChatML: <|im_start|>role\n ... <|im_end|>\n, four tokens around each message (as the prompts are counted)
_START, _END, _NEWLINE = "<|im_start|>", "<|im_end|>", "\n"
_ROLES = tuple(f"{role}\n" for role in ("system", "user", "assistant", "tool", "developer"))
VOCABULARY = (_START, _END, _NEWLINE, *_ROLES, *PIECES)
_IDS = {piece: 256 + index for index, piece in enumerate(VOCABULARY)}


def encode(text: str) -> list[int]:
    """Token ids of ``text``: one per vocabulary piece, else one per UTF-8 byte."""
    ids: list[int] = []
    for piece in _TOKEN_PIECE.findall(text):
        known = _IDS.get(piece)
        if known is None:
            ids.extend(piece.encode("utf-8"))
        else:
            ids.append(known)
    return ids


def encode_chat(messages: list[Mapping[str, Any]], add_generation_prompt: bool, continue_final: bool) -> list[int]:
    """A chat as its template renders it: four tokens around each message's content, two opening the answer;
    a continued final message stays open (the two that open it, then its content)."""
    ids: list[int] = []
    for index, message in enumerate(messages):
        role = f"{message.get('role', '')}\n"
        ids += [_IDS[_START], *([_IDS[role]] if role in _IDS else role.encode())]
        ids += encode(content_text(message.get("content")))
        if not (continue_final and index == len(messages) - 1):
            ids += [_IDS[_END], _IDS[_NEWLINE]]
    if add_generation_prompt and not continue_final:
        ids += [_IDS[_START], _IDS["assistant\n"]]
    return ids


def decode(tokens: list[int]) -> str:
    return b"".join(_piece_bytes(t) for t in tokens).decode("utf-8", "replace")


def _piece_bytes(token: int) -> bytes:
    if 0 <= token < 256:
        return bytes((token,))
    if 256 <= token < 256 + len(VOCABULARY):
        return VOCABULARY[token - 256].encode("utf-8")
    raise io.RequestError(400, f"token id out of range: the emulator's are 0..{255 + len(VOCABULARY)}", "tokens")


def tokenize(raw: bytes, served_model: str, max_model_len: int) -> bytes:
    body = _checked(raw, served_model)
    prompt, messages = body.get("prompt"), body.get("messages")
    if isinstance(prompt, str):
        tokens = encode(prompt)
    elif isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
        continue_final = body.get("continue_final_message") is True
        tokens = encode_chat(messages, body.get("add_generation_prompt", True) is not False, continue_final)
    else:
        raise io.RequestError(400, "either 'prompt' (a string) or 'messages' is required", "prompt")
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
