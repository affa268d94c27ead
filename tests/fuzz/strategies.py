"""Hypothesis strategies for request bodies: any JSON, and OpenAI-shaped bodies with any value in any field."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

I64 = 2**63 - 1
U64 = 2**64 - 1

# Scalars a JSON parser can hand back: orjson reads integers up to u64 and floats as doubles.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-I64 - 1, max_value=U64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)

any_json: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=12), children, max_size=6),
    max_leaves=12,
)

ROLES = ("system", "developer", "user", "assistant", "tool", "", "SYSTEM")


def _field(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a value of the right shape, sometimes any JSON at all."""
    return st.one_of(good, good, any_json)


parts = st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"]), "text": _field(st.text(max_size=60))}),
    max_size=4,
)
messages = st.lists(
    _field(
        st.fixed_dictionaries(
            {"role": _field(st.sampled_from(ROLES))},
            optional={"content": _field(st.one_of(st.none(), st.text(max_size=200), parts)), "name": any_json},
        )
    ),
    max_size=5,
)
prompt = st.one_of(
    st.text(max_size=200),
    st.lists(st.text(max_size=40), max_size=4),
    st.lists(st.integers(min_value=0, max_value=200_000), max_size=20),
    st.lists(st.lists(st.integers(min_value=0, max_value=200_000), max_size=8), max_size=3),
)
positive = st.integers(min_value=-3, max_value=I64)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": _field(st.sampled_from(["fake-model", "", "gpt-4o", "no-such-model"])),
    "messages": _field(messages),
    "prompt": _field(prompt),
    "max_tokens": _field(positive),
    "max_completion_tokens": _field(positive),
    "n": _field(st.integers(min_value=-1, max_value=4)),
    "stream": _field(st.booleans()),
    "temperature": _field(st.floats(min_value=-1, max_value=3, allow_nan=False)),
    "stream_options": _field(st.fixed_dictionaries({}, optional={"include_usage": _field(st.booleans())})),
    "top_p": any_json,
    "stop": any_json,
    "tools": any_json,
}

good_messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(ROLES[:4]), "content": st.one_of(st.text(max_size=200), parts)},
    ),
    min_size=1,
    max_size=4,
)
REQUIRED = {  # present in every OpenAI-shaped body, mostly well-formed: so many bodies reach the upstream
    "model": st.one_of(st.just("fake-model"), st.just("fake-model"), FIELDS["model"]),
    "messages": st.one_of(good_messages, good_messages, FIELDS["messages"]),
    "prompt": st.one_of(st.text(max_size=200), st.text(max_size=200), FIELDS["prompt"]),
}

# OpenAI-shaped bodies: the required fields, a subset of the others (each mostly well-typed), unknown keys.
openai_bodies: st.SearchStrategy[dict[str, Any]] = st.builds(
    lambda known, extra: {**extra, **known},
    st.fixed_dictionaries(REQUIRED, optional={k: v for k, v in FIELDS.items() if k not in REQUIRED}),
    st.dictionaries(st.text(max_size=12), any_json, max_size=3),
)

bodies: st.SearchStrategy[Any] = st.one_of(openai_bodies, openai_bodies, any_json)
