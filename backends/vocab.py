"""Vocabulary check between a target model and its draft, when both configs are readable locally.

vLLM's ``draft_model`` method verifies the draft's token ids against the target's, so both must share one
vocabulary. This reads ``config.json`` of each from a local directory or the Hugging Face cache (offline, no
hub access) and compares ``vocab_size``. It never guesses: when a config is not on disk the result says so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from backends.manifest import PoolManifest

VocabStatus = Literal["match", "mismatch", "unavailable", "not_applicable"]


@dataclass(frozen=True)
class VocabCheck:
    status: VocabStatus
    message: str

    @property
    def failed(self) -> bool:
        return self.status == "mismatch"


def hf_cache_dirs() -> list[Path]:
    """The Hugging Face hub cache directories this process would use."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return [Path(cache)]
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return [home / "hub"]


def find_config(model: str, search_dirs: Sequence[Path] = ()) -> Path | None:
    """``config.json`` of ``model``: a local directory, a directory named after it, or a hub cache snapshot."""
    direct = Path(model) / "config.json"
    if direct.is_file():
        return direct
    for directory in search_dirs:
        named = directory / Path(model).name / "config.json"
        if named.is_file():
            return named
    for cache in hf_cache_dirs():
        snapshots = cache / f"models--{model.replace('/', '--')}" / "snapshots"
        found = sorted(snapshots.glob("*/config.json"))
        if found:
            return found[-1]
    return None


def vocab_size(config_path: Path) -> int | None:
    data = json.loads(config_path.read_text(encoding="utf-8"))
    for section in (data, data.get("text_config") or {}):
        size = section.get("vocab_size")
        if isinstance(size, int):
            return size
    return None


def check_vocabulary(manifest: PoolManifest, search_dirs: Sequence[Path] = ()) -> VocabCheck:
    """Compare target and draft vocabularies for ``method: draft_model`` pools."""
    spec = manifest.speculative
    if spec is None or spec.method != "draft_model" or spec.draft_model is None:
        return VocabCheck("not_applicable", "no separate draft model to compare")
    target_config = find_config(manifest.model, search_dirs)
    draft_config = find_config(spec.draft_model, search_dirs)
    if target_config is None or draft_config is None:
        missing = [name for name, cfg in ((manifest.model, target_config), (spec.draft_model, draft_config))
                   if cfg is None]
        return VocabCheck("unavailable", f"vocabulary not checked: no local config.json for {', '.join(missing)}")
    target_size, draft_size = vocab_size(target_config), vocab_size(draft_config)
    if target_size is None or draft_size is None:
        return VocabCheck("unavailable", "vocabulary not checked: a config.json has no vocab_size")
    if target_size != draft_size:
        return VocabCheck(
            "mismatch",
            f"vocabulary mismatch: target {manifest.model} has vocab_size {target_size}, draft "
            f"{spec.draft_model} has {draft_size}; a draft model must share the target's tokenizer",
        )
    return VocabCheck("match", f"vocabularies match (vocab_size {target_size})")
