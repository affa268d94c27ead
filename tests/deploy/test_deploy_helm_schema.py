"""helm/specgate/values.schema.json rejects values a GPU cluster would only reject at run time."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import CHART_DIR, run_tool

pytestmark = pytest.mark.tools

REJECTED = [
    ("tp3", ["--set", "pools.standard.tensorParallelSize=3"], "/pools/standard/tensorParallelSize"),
    (
        "draft-tp-2-under-tp-1",
        ["--set", "pools.speculative.speculative.draftTensorParallelSize=2"],
        "/pools/speculative/speculative/draftTensorParallelSize",
    ),
    (
        "draft-tp-2-under-tp-8",
        [
            "--set",
            "pools.speculative.tensorParallelSize=8",
            "--set",
            "pools.speculative.speculative.draftTensorParallelSize=2",
        ],
        "/pools/speculative/speculative/draftTensorParallelSize",
    ),
    ("missing-model", ["--set", "pools.speculative.model=null"], "model"),
    ("empty-model", ["--set", "pools.standard.model="], "/pools/standard/model"),
    (
        "unknown-method",
        ["--set", "pools.speculative.speculative.method=lookahead"],
        "/pools/speculative/speculative/method",
    ),
    ("eagle3-without-draft", ["--set", "pools.speculative.speculative.draftModel=null"], "draftModel"),
    (
        "k-11",
        ["--set", "pools.speculative.speculative.numSpeculativeTokens=11"],
        "/pools/speculative/speculative/numSpeculativeTokens",
    ),
    (
        "standard-speculating",
        ["--set", "pools.standard.speculative.method=ngram"],
        "/pools/standard/speculative",
    ),
    (
        "owned-flag-in-extra-args",
        ["--set", "pools.standard.extraArgs[0]=--tensor-parallel-size=2"],
        "/pools/standard/extraArgs/0",
    ),
    ("misspelt-key", ["--set", "pools.standard.tensorParalelSize=2"], "tensorParalelSize"),
    ("external-redis-without-url", ["--set", "redis.mode=external"], "/redis"),
    ("pools-in-rules", ["--set", "gateway.rules.pools.x=1"], "/gateway/rules"),
    ("unknown-backend", ["--set", "backend=tgi"], "/backend"),
]


@pytest.mark.parametrize(("args", "path"), [(a, p) for _, a, p in REJECTED], ids=[i for i, _, _ in REJECTED])
def test_schema_rejects(helm: Path, args: list[str], path: str) -> None:
    result = run_tool([helm, "template", "rel", CHART_DIR, *args])
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert path in result.stderr, result.stderr


def test_schema_rejects_a_values_file_without_a_model(helm: Path, tmp_path: Path) -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    del values["pools"]["standard"]["model"]
    standalone = tmp_path / "chart"
    shutil.copytree(CHART_DIR, standalone)
    (standalone / "values.yaml").write_text(yaml.safe_dump(values))
    result = run_tool([helm, "template", "rel", standalone])
    assert result.returncode != 0
    assert "missing property 'model'" in result.stderr, result.stderr


ACCEPTED = [
    (
        "draft-tp-equal-tp-4",
        [
            "--set",
            "pools.speculative.tensorParallelSize=4",
            "--set",
            "pools.speculative.speculative.draftTensorParallelSize=4",
        ],
    ),
    ("draft-tp-1-under-tp-8", ["--set", "pools.speculative.tensorParallelSize=8"]),
    (
        "mtp-without-draft",
        [
            "--set",
            "pools.speculative.speculative.method=mtp",
            "--set",
            "pools.speculative.speculative.draftModel=null",
            "--set",
            "pools.speculative.speculative.draftTensorParallelSize=null",
        ],
    ),
    ("external-redis-with-url", ["--set", "redis.mode=external", "--set", "redis.url=redis://cache:6379/0"]),
]


@pytest.mark.parametrize("args", [a for _, a in ACCEPTED], ids=[i for i, _ in ACCEPTED])
def test_schema_accepts(helm: Path, args: list[str]) -> None:
    result = run_tool([helm, "template", "rel", CHART_DIR, *args])
    assert result.returncode == 0, result.stderr
