"""The CLI as a user runs it: a real `specgate serve` process in front of fake upstreams."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.bench.loadgen import wait_http
from gateway.cli import build_parser, main
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


def _check_quick_start(url: str) -> None:
    wait_http(url + "/health", timeout_s=30)
    wait_for(lambda: httpx.get(url + "/v1/models").json()["data"] != [], what="models discovered")
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "请总结一下这段文字"}]}
    r = httpx.post(url + "/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["x-specgate-pool"] == "speculative"
    assert r.headers["x-specgate-task"] == "summarization"


def test_serve_rejects_an_invalid_rules_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "rules.yaml"
    bad.write_text("default_pool: slowest\n")
    assert main(["serve", "--rules", str(bad)]) == 2
    assert "default_pool" in capsys.readouterr().err


def test_every_command_has_help() -> None:
    parser = build_parser()
    for command in ("serve", "rules", "bench"):
        with pytest.raises(SystemExit) as info:
            parser.parse_args([command, "--help"])
        assert info.value.code == 0
