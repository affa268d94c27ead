"""What the decider needs to know about one request, read from its parsed body in one pass.

``extract_features`` also validates the fields it reads and raises :class:`InvalidRequest` naming the
bad parameter, so a malformed request is rejected before any routing or forwarding happens.
"""

from __future__ import annotations

import hashlib
import importlib
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.adaptive.content import Content, ContentReader
from gateway.bounds import length_bound, prompt_count, sequences
from gateway.errors import InvalidRequest
from gateway.prefix_index import PrefixReader, PromptPrefix
from gateway.rules import RoutingRules

# System prompts cached per Classifier. Keys are the first ``classify_chars`` characters (all that
# classification reads), so a flood of distinct, huge system prompts holds at most
# _CACHE_LIMIT * classify_chars characters; the cache is emptied when full.
_CACHE_LIMIT = 1024


@dataclass(slots=True)  # not frozen: made per request, and a frozen __init__ costs ~4x; never mutated
class RequestFeatures:
    model: str
    max_tokens: int
    prompt_tokens: int  # an estimate: ~4 characters per token for ASCII text, more for CJK
    task: str
    stream: bool
    n: int
    temperature: float | None
    headers: Mapping[str, str]  # lower-case names
    draw: float = 0.5  # uniform in [0, 1), drawn at extraction: the request's randomness (exploration, split)
    copy: bool = False  # the prompt carries text to transform (a code block, a long quoted passage)
    template: str | None = None  # a stable id of the system prompt (the application), None without one
    objective: str | None = None  # "e2e" or "ttft" from x-specgate-objective; None: the rules file's
    slo_ttft_ms: float | None = None  # x-specgate-slo-ttft-ms
    slo_e2e_ms: float | None = None  # x-specgate-slo-e2e-ms
    prompts: int = 1  # prompts of a /v1/completions batch: each generates n sequences
    # (acceptance rate, output tokens) known in advance: set only by the simulator's perfect-predictor
    # reference (backends/emulator), never from a request; the model then predicts from these, not estimates
    # (a part None: that part is estimated as for any request, so a bound can know one and not the other)
    known: tuple[float | None, int | None] | None = None
    content: Content | None = None  # what the request's text says, for the per-request predictor (adaptive)
    # the prompt's chained block values (gateway/prefix_index.py), read only while the prefix index is on
    blocks: tuple[int, ...] = ()
    session: str | None = None  # the session key (x-session-id, else the first turn with `user`), index on only
    prefix_bytes: int = 0  # the bytes of text the blocks were read from
    # per pool, the prompt tokens expected cached on the replica the pool would pick (gateway.pools.PoolSet.
    # expected_cached): set by the gateway before the decision, only for a request with blocks; None: not known
    cached_tokens: Mapping[str, int] | None = None

    def __init__(
        self, model: str, max_tokens: int, prompt_tokens: int, task: str, stream: bool, n: int,
        temperature: float | None, headers: Mapping[str, str], draw: float = 0.5, copy: bool = False,
        template: str | None = None, objective: str | None = None, slo_ttft_ms: float | None = None,
        slo_e2e_ms: float | None = None, prompts: int = 1, known: tuple[float | None, int | None] | None = None,
        content: Content | None = None, blocks: tuple[int, ...] = (), session: str | None = None,
        prefix_bytes: int = 0, cached_tokens: Mapping[str, int] | None = None,
    ) -> None:  # fmt: skip
        # written out, the fields in order (tests/test_compiled.py checks): compiled, the generated one runs
        # interpreted, 8x slower than this (gateway/compiled.py)
        self.model, self.max_tokens, self.prompt_tokens, self.task = model, max_tokens, prompt_tokens, task
        self.stream, self.n, self.temperature, self.headers, self.draw = stream, n, temperature, headers, draw
        self.copy, self.template, self.objective = copy, template, objective
        self.slo_ttft_ms, self.slo_e2e_ms, self.prompts, self.known = slo_ttft_ms, slo_e2e_ms, prompts, known
        self.content, self.blocks, self.session, self.prefix_bytes = content, blocks, session, prefix_bytes
        self.cached_tokens = cached_tokens

    def cached_on(self, pool: str) -> int:
        """The prompt tokens the pool's chosen replica is expected to hold (0 unless ``cached_tokens`` says)."""
        cached = self.cached_tokens
        return cached.get(pool, 0) if cached is not None else 0

    @property
    def sequences(self) -> int:
        """Sequences the request generates, each up to ``max_tokens``: what its token charge multiplies."""
        return self.n * self.prompts


class Classifier:
    """Task type from the system prompt, then the last user message, using the rules file's cues.

    The task with the most matching cues wins; ties go to the order in the file. Results for system
    prompts are cached (they repeat across requests; keyed by the prefix classification reads, capped at
    ``_CACHE_LIMIT`` entries); user prompts are not.
    """

    def __init__(
        self, rules: RoutingRules, *, read_content: bool | None = None, prefixes: PrefixReader | None = None
    ) -> None:
        self._default = rules.defaults.task
        self._chars = rules.defaults.classify_chars
        # per task: its keywords, lower-cased (all, and the ASCII ones: an ASCII text can hold no other), and its
        # patterns with the literals one of which any match holds (None: no prefilter)
        self._tasks = [
            (
                name,
                tuple(k.lower() for k in cues.keywords),
                tuple(k.lower() for k in cues.keywords if k.isascii()),
                tuple((*compile_cue_pattern(p), required_literals(p)) for p in cues.patterns),
            )
            for name, cues in rules.tasks.items()
        ]
        self._system_cache: dict[str, tuple[str | None, str]] = {}  # key -> (its task or None, template id)
        # content features for the learned model (a bounded cache of their own): read where the rules route by the
        # model (``fastest``), or where ``read_content`` says so (the simulator: one set of features for every policy)
        if read_content is None:
            read_content = rules.uses_fastest
        self.content = ContentReader() if read_content else None
        self.prefixes = prefixes  # set while the prefix index is on: each request's blocks and session key

    def classify(self, system: str | None, user: str | None) -> str:
        return self.classify_with_template(system, user)[0]

    def classify_with_template(self, system: str | None, user: str | None) -> tuple[str, str | None]:
        """The task, and the system prompt's template id (None without a system prompt): a digest of the
        characters classification reads, stable across processes (it is shared through Redis), so requests of
        one application, whatever their user messages, share what the learner knows about its template."""
        template = None
        if system:
            key = system[: self._chars]  # all _match reads; never the whole (up to max_body_bytes) prompt
            cached = self._system_cache.get(key)
            if cached is None:
                digest = hashlib.blake2b(key.encode("utf-8", "replace"), digest_size=8).hexdigest()
                cached = (self._match(key), digest)
                if len(self._system_cache) >= _CACHE_LIMIT:
                    self._system_cache.clear()
                self._system_cache[key] = cached
            task, template = cached
            if task is not None:
                return task, template
        if user:
            task = self._match(user)
            if task is not None:
                return task, template
        return self._default, template

    def _match(self, text: str) -> str | None:
        head = text[: self._chars]
        lowered = head.lower()
        ascii = lowered.isascii()
        best, best_score = None, 0
        for name, keywords, ascii_keywords, patterns in self._tasks:
            score = sum(1 for k in (ascii_keywords if ascii else keywords) if k in lowered)
            for pattern, on_lowered, literals in patterns:
                # the literals first: a substring scan is ~10x cheaper than a search that starts with a \b
                if (literals is None or (on_lowered and any(literal in lowered for literal in literals))) and (
                    pattern.search(lowered if on_lowered else head)
                ):
                    score += 1
            if score > best_score:
                best, best_score = name, score
        return best


def compile_cue_pattern(pattern: str) -> tuple[re.Pattern[str], bool]:
    r"""A cue pattern matched case-insensitively, and whether it runs on the lower-cased text.

    A pattern with no upper-case letter at all matches the lower-cased text exactly as it would match the
    original with ``re.IGNORECASE``, and Python's ``re`` runs it about 3x faster that way (a 3,000-character
    prompt: 164 -> 50 us for the shipped code pattern). Any other pattern (``[A-Z]``, ``\S``...) keeps the flag.
    """
    if pattern == pattern.lower():
        return re.compile(pattern), True
    return re.compile(pattern, re.I), False


_LITERALS_LIMIT = 64  # literals a prefilter holds at most (each is a substring scan)


def required_literals(pattern: str) -> tuple[str, ...] | None:
    r"""Literals one of which any match of a lower-case cue pattern holds, as a prefilter: a text that holds none
    of them cannot match. None where the pattern gives none (it may start with a class, a repeat...) or is not
    one ``compile_cue_pattern`` runs on the lower-cased text.

    Read from the pattern's parse (``re._parser``, the parser ``re.compile`` uses): from the start, literals
    and alternations of literals, each alternative's own literals, across zero-width items (``\b``,
    lookarounds), up to the first item that is neither. ``\b(python|java)\b`` gives ``("python", "java")``,
    ``\bc(\+\+|#)`` gives ``("c++", "c#")``, ``(成|为)英文`` gives ``("成英文", "为英文")``.
    """
    if pattern != pattern.lower():
        return None
    try:
        # private modules, so guarded: no prefilter if they change
        sre, parser = importlib.import_module("re._constants"), importlib.import_module("re._parser")
        parsed = parser.parse(pattern)
        if parsed.state.flags & re.IGNORECASE:
            return None
        found, _ = _literal_prefixes(list(parsed), sre)
    except Exception:  # a prefilter is an optimisation: without one, the pattern runs as is
        return None
    if not found or "" in found:
        return None
    return tuple(sorted(found))


def _literal_prefixes(items: list[Any], sre: Any) -> tuple[set[str], bool]:
    """The literal strings a sequence of parsed items starts with, and whether they are the whole sequence."""
    found = {""}
    for op, value in items:
        if op in (sre.AT, sre.ASSERT, sre.ASSERT_NOT):  # zero-width: the literals around it stay adjacent
            continue
        if op is sre.LITERAL:
            alternatives, whole = {chr(value)}, True
        elif op is sre.IN and value and all(kind is sre.LITERAL for kind, _ in value):
            alternatives, whole = {chr(char) for _, char in value}, True
        elif op is sre.SUBPATTERN and not value[1] & re.IGNORECASE:
            alternatives, whole = _literal_prefixes(list(value[3]), sre)
        elif op is sre.BRANCH:
            alternatives, whole = set(), True
            for branch in value[1]:
                prefixes, complete = _literal_prefixes(list(branch), sre)
                alternatives |= prefixes
                whole = whole and complete
        else:
            return found, False
        if len(found) * len(alternatives) > _LITERALS_LIMIT:
            return found, False
        found = {head + tail for head in found for tail in alternatives}
        if not whole:
            return found, False
    return found, True


def extract_features(
    body: Mapping[str, Any],
    kind: str,
    headers: Mapping[str, str],
    rules: RoutingRules,
    classifier: Classifier,
    draw: float | None = None,
) -> RequestFeatures:
    """Validate and read one request body. ``kind`` is ``"chat"`` or ``"completions"``.

    ``draw`` is the request's uniform random number (a fresh one when None; the simulator passes seeded ones).
    """
    model = body.get("model", "")
    if not isinstance(model, str):
        raise InvalidRequest("'model' must be a string", param="model")
    prompts = 1
    if kind == "chat":
        system, user, chars = _chat_text(body.get("messages"))
    else:
        system, user, chars = None, *_prompt_text(body.get("prompt"))
        prompts = prompt_count(body.get("prompt"))
    bound = length_bound(body)  # every spelling checked; the largest counts
    max_tokens = bound[1] if bound is not None else rules.defaults.max_tokens
    prefix: PromptPrefix | None = None
    reader = classifier.prefixes
    if reader is not None:
        if kind == "chat":
            prefix = reader.chat(body["messages"], body.get("user"), headers)
        else:
            prefix = reader.completion(body["prompt"], body.get("user"), headers)
    return request_features(
        body, headers, classifier, model, max_tokens, chars, system, user, draw, has_n=True, prompts=prompts,
        prefix=prefix,
    )  # fmt: skip


def request_features(
    body: Mapping[str, Any], headers: Mapping[str, str], classifier: Classifier, model: str, max_tokens: int,
    prompt_tokens: int, system: str | None, user: str | None, draw: float | None, *, has_n: bool, prompts: int = 1,
    prefix: PromptPrefix | None = None,
) -> RequestFeatures:  # fmt: skip
    """The features every routed endpoint shares, once the endpoint has read its model, length and texts:
    task, stream, n (where the endpoint has it), temperature, the request's draw, the copy cue and the
    routing headers (objective, SLOs), validated in that order; ``prefix``: the prompt's blocks and session key
    where the prefix index read them."""
    task, template = classifier.classify_with_template(system, user)
    stream = _optional(body, "stream", bool, False)
    n = sequences(body) if has_n else 1  # n, or vLLM's best_of when larger
    temperature = _temperature(body)
    copy = has_copy_cue(user)
    reader = classifier.content
    content = None
    if reader is not None:
        content = reader.read(system, user, task, copy, prompt_tokens, max_tokens, n, temperature, n * prompts)
    features = RequestFeatures(
        model=model,
        max_tokens=max_tokens,
        prompt_tokens=prompt_tokens,
        task=task,
        stream=stream,
        n=n,
        temperature=temperature,
        headers=headers,
        draw=random.random() if draw is None else draw,
        copy=copy,
        template=template,
        objective=_objective(headers),
        slo_ttft_ms=_slo(headers, "x-specgate-slo-ttft-ms"),
        slo_e2e_ms=_slo(headers, "x-specgate-slo-e2e-ms"),
        prompts=prompts,
        content=content,
    )
    if prefix is not None:  # set here, not passed above: with the index off, the features cost what they did
        features.blocks, features.session, features.prefix_bytes = prefix
    return features


# A long quoted passage, as (opener, pattern, what the pattern's search needs before the text): "..." of 120+
# characters on one line, a "> " quoted line of 60+, “...” of 120+, 「...」 of 60+. Each search is linear in the
# text, and starts with one literal (a fast scan; a set of first characters is 10x slower on plain text).
# "..." and \n>... are linear as written: an attempt's content stops at the next opener, so no two attempts scan
# the same stretch. `“[^”]{120,}”` (and its 「」 twin) is not: its content may hold openers, so retried from each
# of 8,000 “ it scans to the end each time (quadratic: 16-38 ms a message). Its pattern starts at a closer (one
# is put before the text), skips to the stretch's first opener and needs the stretch's closer far enough away:
# the match `“[^”]{120,}”` finds, as the openers between two closers all share the later one, the first the
# farthest from it.
_QUOTED = (
    ('"', re.compile(r'"[^"\n]{120,}"'), ""),
    ("\n>", re.compile(r"\n>[^\n]{60,}"), ""),
    ("“", re.compile(r"”[^“”]*“[^”]{120,}”"), "”"),
    ("「", re.compile(r"」[^「」]*「[^」]{60,}」"), "」"),
)


def has_copy_cue(text: str | None) -> bool:
    """The prompt carries text the answer may copy from: a code block or a long quoted passage.

    Speculation's gain follows how much of the answer can be copied from the prompt (n-gram and draft
    models both guess such tokens well), whatever the task is called. A cheap cue; the learner finds out
    per deployment how much it matters. Reads the first 8,000 characters, in time linear in them.
    """
    if not text:
        return False
    head = text[:8000]
    if "```" in head:
        return True
    return any(opener in head and pattern.search(before + head) is not None for opener, pattern, before in _QUOTED)


def _objective(headers: Mapping[str, str]) -> str | None:
    value = headers.get("x-specgate-objective")
    if value is None:
        return None
    if value not in ("e2e", "ttft"):
        raise InvalidRequest("header 'x-specgate-objective' must be 'e2e' or 'ttft'", param="x-specgate-objective")
    return value


def _slo(headers: Mapping[str, str], name: str) -> float | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 < number < 1e9:
        raise InvalidRequest(f"header '{name}' must be a positive number of milliseconds", param=name)
    return number


def _chat_text(messages: Any) -> tuple[str | None, str | None, int]:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    system: str | None = None
    user: str | None = None
    tokens = 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(f"messages[{index}] must be an object with a string 'role'", param="messages")
        text = _content_text(message.get("content"), index)
        tokens += estimate_tokens(text) + 4
        role = message["role"]
        if role in ("system", "developer") and system is None:
            system = text
        elif role == "user":
            user = text
    return system, user, tokens


def _content_text(content: Any, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "\n".join(p for p in parts if isinstance(p, str))
    raise InvalidRequest(f"messages[{index}].content must be a string or an array of parts", param="messages")


def _prompt_text(prompt: Any) -> tuple[str | None, int]:
    if isinstance(prompt, str):
        return prompt, estimate_tokens(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return prompt[0], sum(estimate_tokens(p) for p in prompt)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return None, len(prompt)
        if all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt):
            return None, sum(len(p) for p in prompt)
    raise InvalidRequest("'prompt' must be a string, an array of strings, or an array of token ids", param="prompt")


def estimate_tokens(text: str) -> int:
    """A cheap estimate: ~4 characters a token for ASCII, ~1.5 for CJK and other scripts, each part of a mixed
    text at its own rate. The non-ASCII characters are counted from the UTF-8 length, half a character per
    extra byte: a CJK character (3 bytes) counts whole, an accented Latin or a Cyrillic one (2 bytes) half, so
    an English text with a curly quote is read as English (it read as CJK before: 2.7x its tokens)."""
    if text.isascii():
        return (len(text) + 3) // 4
    chars = len(text)
    other = min(chars, (len(text.encode("utf-8", "surrogatepass")) - chars + 1) // 2)
    return (chars - other + 3) // 4 + (other * 2 + 2) // 3


def _optional(body: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise InvalidRequest(f"'{key}' must be a {kind.__name__}", param=key)
    return value


def _temperature(body: Mapping[str, Any]) -> float | None:
    value = body.get("temperature")
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise InvalidRequest("'temperature' must be a non-negative number", param="temperature")
    try:
        return float(value)
    except OverflowError:  # an integer past a double's range (orjson reads those as floats; other parsers don't)
        raise InvalidRequest("'temperature' is out of range", param="temperature") from None
