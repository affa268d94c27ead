from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.config import Settings


def test_environment_variables_with_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECGATE_STANDARD_URLS", "http://a:1/, http://b:2")
    monkeypatch.setenv("SPECGATE_PORT", "9000")
    monkeypatch.setenv("SPECGATE_IDLE_TIMEOUT_S", "5")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.standard_urls == ["http://a:1", "http://b:2"]
    assert (settings.port, settings.idle_timeout_s) == (9000, 5.0)


def test_dotenv_file(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("SPECGATE_SPECULATIVE_URLS=http://s:8000\nSPECGATE_UPSTREAM_CLIENT=httpx\n")
    settings = Settings(_env_file=env)  # type: ignore[call-arg]
    assert settings.speculative_urls == ["http://s:8000"]
    assert settings.upstream_client == "httpx"


@pytest.mark.parametrize(
    ("key", "value"), [("port", 70000), ("connect_timeout_s", 0), ("upstream_client", "curl"), ("max_body_bytes", 1)]
)
def test_bad_settings_name_the_key(key: str, value: object) -> None:
    with pytest.raises(ValidationError) as info:
        Settings(_env_file=None, **{key: value})  # type: ignore[call-arg]
    assert key in str(info.value)


def test_unknown_keys_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="idle_timeout"):
        Settings(_env_file=None, idle_timeout=3)  # type: ignore[call-arg]
    monkeypatch.setenv("SPECGATE_STANDARD_URL", "http://typo:1")
    with pytest.raises(ValidationError, match="SPECGATE_STANDARD_URL"):
        Settings(_env_file=None)  # type: ignore[call-arg]


def test_foreign_dotenv_entries_are_left_alone(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("HF_TOKEN=secret\nSPECGATE_PORT=9001\n")
    assert Settings(_env_file=env).port == 9001  # type: ignore[call-arg]


def test_the_scripts_own_variables_are_not_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECGATE_CACHE", "/tmp/cache")
    monkeypatch.setenv("SPECGATE_VENV", "/tmp/venv")
    assert Settings(_env_file=None).port == 8080  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("mode", "standard", "reads", "indexed"),
    [("auto", ["http://a:1"], False, True), ("auto", ["http://a:1", "http://b:1"], True, True),
     ("on", ["http://a:1"], True, True), ("off", ["http://a:1", "http://b:1"], False, False)],
    ids=["auto-one-replica", "auto-two-replicas", "on", "off"],
)  # fmt: skip
def test_the_prefix_index_setting(mode: str, standard: list[str], reads: bool, indexed: bool) -> None:
    """`auto` reads prompts only where a pool has more than one replica to choose from; `off` keeps no index."""
    from prometheus_client import CollectorRegistry

    from gateway.state import GatewayState

    settings = Settings(_env_file=None, prefix_index=mode, standard_urls=standard, speculative_urls=["http://s:1"],
                        prefix_index_blocks_per_replica=64)  # type: ignore[call-arg]  # fmt: skip
    state = GatewayState(settings, CollectorRegistry())
    assert (state.ruleset.classifier.prefixes is not None) == reads
    assert (state.pools.index is not None) == indexed
    if indexed:
        assert state.pools.index is not None and state.pools.index.capacity == 64


def test_prefix_index_settings_are_checked() -> None:
    with pytest.raises(ValidationError, match="prefix_index"):
        Settings(_env_file=None, prefix_index="sometimes")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="prefix_index_blocks_per_replica"):
        Settings(_env_file=None, prefix_index_blocks_per_replica=0)  # type: ignore[call-arg]
