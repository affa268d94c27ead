"""Vocabulary check between target and draft, from config.json files found locally (dir or HF cache)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.manifest import PoolManifest, load_manifest, pool_path
from backends.vocab import check_vocabulary, find_config


def write_config(directory: Path, vocab_size: int | None, nested: bool = False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    body: dict[str, object] = {"model_type": "llama"}
    if vocab_size is not None:
        body.update({"text_config": {"vocab_size": vocab_size}} if nested else {"vocab_size": vocab_size})
    (directory / "config.json").write_text(json.dumps(body), encoding="utf-8")
    return directory


def draft_pool(target: str, draft: str) -> PoolManifest:
    return PoolManifest.model_validate({
        "pool": "speculative", "model": target, "served_model_name": "m", "gpus_per_replica": 1,
        "gpu_type": "L4", "speculative": {"method": "draft_model", "draft_model": draft,
                                          "num_speculative_tokens": 3}})


def test_match_in_local_directories(tmp_path: Path) -> None:
    target = write_config(tmp_path / "target", 128256)
    draft = write_config(tmp_path / "draft", 128256, nested=True)
    result = check_vocabulary(draft_pool(str(target), str(draft)))
    assert (result.status, result.failed) == ("match", False)
    assert "128256" in result.message


def test_mismatch_is_reported_clearly(tmp_path: Path) -> None:
    target = write_config(tmp_path / "target", 128256)
    draft = write_config(tmp_path / "draft", 32000)
    result = check_vocabulary(draft_pool(str(target), str(draft)))
    assert result.failed
    assert "vocabulary mismatch" in result.message
    assert "128256" in result.message and "32000" in result.message


def test_found_in_the_hugging_face_cache_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    write_config(tmp_path / "hub" / "models--org--big" / "snapshots" / "abc123", 50000)
    write_config(tmp_path / "hub" / "models--org--small" / "snapshots" / "def456", 49152)
    assert find_config("org/big") == tmp_path / "hub/models--org--big/snapshots/abc123/config.json"
    result = check_vocabulary(draft_pool("org/big", "org/small"))
    assert result.failed and "50000" in result.message


def test_found_by_name_in_a_search_directory(tmp_path: Path) -> None:
    write_config(tmp_path / "models" / "Big", 10)
    write_config(tmp_path / "models" / "Small", 10)
    result = check_vocabulary(draft_pool("org/Big", "org/Small"), search_dirs=[tmp_path / "models"])
    assert result.status == "match"


def test_unreadable_configs_are_said_not_guessed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    target = write_config(tmp_path / "target", 128256)
    result = check_vocabulary(draft_pool(str(target), "nowhere/draft"))
    assert (result.status, result.failed) == ("unavailable", False)
    assert "nowhere/draft" in result.message
    no_size = write_config(tmp_path / "nosize", None)
    assert check_vocabulary(draft_pool(str(target), str(no_size))).status == "unavailable"


def test_methods_without_a_draft_model_are_not_applicable() -> None:
    assert check_vocabulary(load_manifest(pool_path("speculative", cpu=True))).status == "not_applicable"
    assert check_vocabulary(load_manifest(pool_path("standard"))).status == "not_applicable"
