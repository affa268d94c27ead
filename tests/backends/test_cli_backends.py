"""``specgate backends render|check|launch`` through the real CLI entry point."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.manifest import load_manifest, pool_path
from backends.render import render_argv, render_compose_service, render_helm_values
from gateway.cli import main
from gateway.rules import default_rules_path


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("pool", ["standard", "speculative"])
def test_render_every_format(pool: str, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = load_manifest(pool_path(pool))
    code, out, _ = run(["backends", "render", pool], capsys)
    assert code == 0 and json.loads(out) == render_argv(manifest)
    code, out, _ = run(["backends", "render", pool, "--format", "shell"], capsys)
    assert code == 0 and shlex.split(out.replace("\\\n", " ")) == render_argv(manifest)
    code, out, _ = run(["backends", "render", pool, "--format", "compose"], capsys)
    assert code == 0 and yaml.safe_load(out) == {"services": {f"vllm-{pool}": render_compose_service(manifest)}}
    code, out, _ = run(["backends", "render", pool, "--format", "helm-values"], capsys)
    assert code == 0 and yaml.safe_load(out) == render_helm_values(manifest)


def test_render_cpu_pair_and_legacy_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["backends", "render", "speculative", "--cpu"], capsys)
    assert code == 0 and "--speculative-config" in json.loads(out)
    example = str(pool_path("standard").parent / "examples" / "llama70b-draft8b.yaml")
    code, out, _ = run(["backends", "render", example, "--vllm-version", "0.9.2"], capsys)
    assert code == 0 and "--speculative-model" in json.loads(out)


def test_render_errors_exit_1_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["backends", "render", str(tmp_path / "missing.yaml")], capsys)
    assert code == 1 and "cannot read manifest" in err
    eagle3 = str(pool_path("speculative"))
    code, _, err = run(["backends", "render", eagle3, "--vllm-version", "0.8.0"], capsys)
    assert code == 1 and "needs vLLM >= 0.10" in err


def write_rules(tmp_path: Path, **data: Any) -> Path:
    body = {"pools": {"standard": {"replicas": []}, "speculative": {"replicas": []}}, **data}
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    return path


def test_check_passes_on_the_shipped_files(capsys: pytest.CaptureFixture[str]) -> None:
    rules = default_rules_path()
    code, out, _ = run(["backends", "check", "--rules", str(rules)], capsys)
    assert code == 0, out
    assert "0 error(s)" in out
    code, out, _ = run(["backends", "check", "--cpu", "--rules", str(rules)], capsys)
    assert code == 0, out


def test_check_reports_disagreement_with_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = write_rules(tmp_path, models=["some-other-model"])
    code, out, _ = run(["backends", "check", "--cpu", "--rules", str(rules)], capsys)
    assert code == 1
    assert "error: standard: served_model_name 'smollm2-135m-instruct' is not in the rules file's models" in out
    assert "2 error(s)" in out


def test_check_reports_invalid_rules_and_manifests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pools = tmp_path / "pools"
    pools.mkdir()
    (pools / "standard.yaml").write_text(pool_path("standard").read_text(), encoding="utf-8")
    bad = yaml.safe_load(pool_path("speculative").read_text())
    bad["speculative"]["num_speculative_tokens"] = 12
    (pools / "speculative.yaml").write_text(yaml.safe_dump(bad), encoding="utf-8")
    rules = write_rules(tmp_path, pools={"standard": {"replicas": ["not a url"]}})
    code, out, _ = run(["backends", "check", "--pools-dir", str(pools), "--rules", str(rules)], capsys)
    assert code == 1
    assert "speculative.num_speculative_tokens: Input should be less than or equal to 10" in out
    assert "pools.standard.replicas" in out


def test_launch_needs_a_pool_unless_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["backends", "launch"], capsys)
    assert code == 2 and "use --cpu alone" in err


def test_launch_replicas_go_with_both_cpu_pools_only(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["backends", "launch", "standard", "--cpu", "--replicas", "2"], capsys)
    assert code == 2 and "--replicas goes with --cpu alone" in err
    code, _, err = run(["backends", "launch", "--cpu", "--replicas", "0"], capsys)
    assert code == 2 and "at least 1" in err


def test_launch_execs_the_rendered_argv(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    execs: list[tuple[str, list[str], dict[str, str]]] = []

    def fake_exec(file: str, argv: list[str], env: dict[str, str]) -> None:
        execs.append((file, argv, env))

    monkeypatch.setattr(os, "execvpe", fake_exec)
    main(["backends", "launch", "speculative", "--port", "9001"])
    ((file, argv, _),) = execs
    expected = render_argv(load_manifest(pool_path("speculative")).model_copy(update={"port": 9001}))
    assert (file, argv) == ("vllm", expected)
    assert "exec: vllm serve" in capsys.readouterr().err


def test_launch_cpu_without_the_engine_says_how_to_prepare_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPECGATE_CACHE", str(tmp_path))
    code, _, err = run(["backends", "launch", "standard", "--cpu"], capsys)
    assert code == 1 and "scripts/setup/30-vllm-cpu.sh" in err
    code, _, err = run(["backends", "launch", "--cpu"], capsys)
    assert code == 1 and "CPU engine venv not prepared" in err
