"""The CLI as a user runs it: a real `specgate serve` process in front of fake upstreams."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway import __version__
from gateway.bench.loadgen import wait_http
from gateway.cli import build_parser, main
from gateway.rules import default_rules
from gateway.servers import free_port
from tests.conftest import Upstreams, wait_for


def test_serve_quick_start_without_a_rules_file(upstreams: Upstreams, tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--standard", upstreams.standard_url,
           "--speculative", upstreams.speculative_url, "--port", str(port)]  # fmt: skip
    with (tmp_path / "serve.log").open("wb") as log, subprocess.Popen(cmd, stdout=log, stderr=log) as proc:
        try:
            _check_quick_start(f"http://127.0.0.1:{port}")
        finally:
            proc.terminate()
            proc.wait(10)
    # One start-up summary: version, address, rules, each pool's replicas, Redis/Prometheus, upstream client.
    logged = (tmp_path / "serve.log").read_text()
    for expected in (
        f"specgate {__version__} listening on http://127.0.0.1:{port}",
        f"rules: shipped gateway/rules.yaml ({len(default_rules().rules)} rules, default pool standard)",
        f"pool standard: {upstreams.standard_url}",
        f"pool speculative: {upstreams.speculative_url}",
        "redis: off",
        "prometheus: off",
        "upstream client: auto (raw for http://, aiohttp for https://); log format: text; tracing: off",
        "request path: interpreted (no compiled modules",  # the tests run the editable (source) install
    ):
        assert expected in logged, f"{expected!r} not in the start-up log:\n{logged}"


def _check_quick_start(url: str) -> None:
    wait_http(url + "/health", timeout_s=30)
    wait_for(lambda: httpx.get(url + "/v1/models").json()["data"] != [], what="models discovered")
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "请总结一下这段文字"}]}
    r = httpx.post(url + "/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["x-specgate-task"] == "summarization"
    # The shipped rules warm up on the reference rules (summaries to speculative), exploring the other pool
    # for up to 2 % of requests so that both pools' models fill.
    reason = r.headers["x-specgate-reason"]
    assert reason.startswith("draft-friendly-task (warm-up)"), reason
    expected = "standard" if reason.endswith("explore") else "speculative"
    assert r.headers["x-specgate-pool"] == expected


def test_serve_rejects_an_invalid_rules_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "rules.yaml"
    bad.write_text("default_pool: slowest\n")
    assert main(["serve", "--rules", str(bad)]) == 2
    assert "default_pool" in capsys.readouterr().err


def test_serve_rejects_invalid_keys_naming_the_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECGATE_KEYS", "{keys: [{name: app, key: sk-never-printed, rpm: -1}]}")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "invalid API keys from SPECGATE_KEYS" in err and "keys.0.rpm" in err and "sk-never-printed" not in err


NO_POOLS = "version: 1\npools: {standard: {replicas: []}, speculative: {replicas: []}}\n"


@pytest.mark.parametrize(
    ("args", "env"),
    [
        ([], {}),  # the shipped rules list no replicas
        (["--rules", "{rules}"], {}),
        (["--port", "9"], {"SPECGATE_STANDARD_URLS": ""}),
    ],
    ids=["shipped-rules", "rules-file-without-replicas", "empty-variable"],
)
def test_serve_refuses_to_start_without_any_replica(
    args: list[str], env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    rules = tmp_path / "rules.yaml"
    rules.write_text(NO_POOLS)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["serve", *(a.replace("{rules}", str(rules)) for a in args)]) == 2
    err = capsys.readouterr().err
    assert "no replicas" in err and "--standard/--speculative" in err and "`pools:`" in err


def test_help_says_what_specgate_is(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "specgate is a latency-aware routing gateway for LLM serving." in out
    assert "register(subparsers)" not in out


def test_every_command_has_help() -> None:
    parser = build_parser()
    for command in ("serve", "rules", "bench", "sync-copies"):
        with pytest.raises(SystemExit) as info:
            parser.parse_args([command, "--help"])
        assert info.value.code == 0


def test_serve_help_names_the_default_rules_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "default: the shipped gateway/rules.yaml, the adaptive policy" in out
    assert "reference rules)" not in out  # the reference rules are not the default
    assert default_rules().uses_fastest  # and the default really is the adaptive policy
