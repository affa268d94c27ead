"""The manifest schema: every shipped file loads; bad ones fail naming the key."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from backends.manifest import (
    ManifestError,
    load_manifest,
    pool_path,
    resolve_manifest,
    shipped_manifests,
)

SPECULATIVE: dict[str, Any] = {
    "pool": "speculative",
    "model": "meta-llama/Llama-3.1-70B-Instruct",
    "served_model_name": "llama-70b",
    "tensor_parallel_size": 4,
    "gpus_per_replica": 4,
    "gpu_type": "H100-80GB",
    "speculative": {
        "method": "draft_model",
        "draft_model": "meta-llama/Llama-3.1-8B-Instruct",
        "num_speculative_tokens": 5,
        "draft_tensor_parallel_size": 1,
    },
}


def test_every_shipped_manifest_loads() -> None:
    paths = shipped_manifests()
    names = {path.relative_to(pool_path("standard").parent).as_posix() for path in paths}
    assert {"standard.yaml", "speculative.yaml", "cpu/standard.yaml", "cpu/speculative.yaml"} <= names
    methods = set()
    for path in paths:
        manifest = load_manifest(path)
        if manifest.speculative is not None:
            methods.add(manifest.speculative.method)
    assert {"draft_model", "eagle3", "medusa", "mtp", "ngram"} <= methods


def test_shipped_pair_is_named_after_its_files() -> None:
    for cpu in (False, True):
        for pool in ("standard", "speculative"):
            assert load_manifest(pool_path(pool, cpu=cpu)).pool == pool


def test_cpu_speculative_pool_is_the_measured_ngram_setup() -> None:
    spec = load_manifest(pool_path("speculative", cpu=True)).speculative
    assert spec is not None
    assert (spec.method, spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max) == (
        "ngram", 4, 2, 4)


def test_seventy_b_example_is_tp4_with_a_tp1_draft() -> None:
    manifest = load_manifest(pool_path("standard").parent / "examples" / "llama70b-draft8b.yaml")
    assert manifest.tensor_parallel_size == 4 and manifest.gpus_per_replica == 4
    assert manifest.speculative is not None and manifest.speculative.draft_tensor_parallel_size == 1


def _set(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    result = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    node = result
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return result


_DELETE = object()

BAD_CASES = [
    ("tensor_parallel_size", 3, "tensor_parallel_size"),
    ("tensor_paralel_size", 4, "tensor_paralel_size: Extra inputs are not permitted"),
    ("gpus_per_replica", 8, "gpus_per_replica (8) must equal tensor_parallel_size x pipeline_parallel_size"),
    ("pipeline_parallel_size", 2, "gpus_per_replica (4) must equal"),
    ("gpu_type", _DELETE, "gpu_type is required"),
    ("gpu_memory_utilization", 1.5, "gpu_memory_utilization"),
    ("replicas", 0, "replicas"),
    ("pool", "fast", "pool"),
    ("speculative.num_speculative_tokens", 11, "speculative.num_speculative_tokens"),
    ("speculative.num_speculative_tokens", 0, "speculative.num_speculative_tokens"),
    ("speculative.method", "lookahead", "speculative.method"),
    ("speculative.draft_tensor_parallel_size", 2, "speculative.draft_tensor_parallel_size must be 1 or equal"),
    ("speculative.draft_model", _DELETE, "draft_model is required for method 'draft_model'"),
    ("speculative.prompt_lookup_max", 4, "prompt_lookup_min/max are for method 'ngram' only"),
    ("speculative.extra", 1, "speculative.extra: Extra inputs are not permitted"),
    ("speculative", _DELETE, "the speculative pool needs a speculative block"),
    ("pool", "standard", "the standard pool must not speculate"),
    ("extra_args", ["--tensor-parallel-size=8"], "extra_args: --tensor-parallel-size is set by the manifest"),
    ("extra_args", ["--speculative-config", "{}"], "extra_args: --speculative-config is set by the manifest"),
    ("device", "cpu", "device 'cpu' needs gpus_per_replica: 0"),
]


@pytest.mark.parametrize(("key", "value", "expected"), BAD_CASES,
                         ids=[f"{key}={value!r}"[:60] for key, value, _ in BAD_CASES])
def test_bad_manifest_names_the_key(
    write_manifest: Callable[[dict[str, Any]], Path], key: str, value: Any, expected: str
) -> None:
    assert load_manifest(write_manifest(SPECULATIVE))  # the base case is valid
    path = write_manifest(_set(SPECULATIVE, key, value))
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    assert str(path) in str(caught.value)
    assert expected in str(caught.value)


NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
NGRAM_CASES = [
    ({**NGRAM, "prompt_lookup_min": 5}, "prompt_lookup_min (5) must not exceed prompt_lookup_max (4)"),
    ({k: v for k, v in NGRAM.items() if k != "prompt_lookup_max"}, "prompt_lookup_max is required"),
    ({**NGRAM, "draft_model": "x/y"}, "draft_model is not used by method 'ngram'"),
    ({**NGRAM, "draft_tensor_parallel_size": 1}, "draft_tensor_parallel_size is not used by method 'ngram'"),
]


@pytest.mark.parametrize(("spec", "expected"), NGRAM_CASES, ids=["min>max", "no-max", "draft", "draft-tp"])
def test_bad_ngram_block(write_manifest: Callable[[dict[str, Any]], Path], spec: dict[str, Any],
                         expected: str) -> None:
    path = write_manifest({**SPECULATIVE, "speculative": spec})
    with pytest.raises(ManifestError, match="speculative") as caught:
        load_manifest(path)
    assert expected in str(caught.value)


def test_draft_tp_equal_to_target_tp_is_allowed(write_manifest: Callable[[dict[str, Any]], Path]) -> None:
    manifest = load_manifest(write_manifest(_set(SPECULATIVE, "speculative.draft_tensor_parallel_size", 4)))
    assert manifest.speculative is not None and manifest.speculative.draft_tensor_parallel_size == 4


def test_not_a_mapping_and_missing_file(tmp_path: Path) -> None:
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n", encoding="utf-8")
    with pytest.raises(ManifestError, match="must be a YAML mapping"):
        load_manifest(listing)
    with pytest.raises(ManifestError, match="cannot read manifest"):
        load_manifest(tmp_path / "absent.yaml")


def test_resolve_manifest_maps_pool_names_and_passes_paths() -> None:
    assert resolve_manifest("standard") == pool_path("standard")
    assert resolve_manifest("speculative", cpu=True) == pool_path("speculative", cpu=True)
    assert resolve_manifest("some/file.yaml") == Path("some/file.yaml")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([[2, 16, 3]], "must start at 1"),
        ([[1, 16, 3], [10, 32, 1]], "overlap"),
        ([[1, 16, 6]], "between 0 and num_speculative_tokens"),
    ],
    ids=["not-from-1", "overlap", "k-above-max"],
)
def test_a_bad_per_batch_size_k_table_is_refused_naming_the_key(
    write_manifest: Callable[[dict[str, Any]], Path], table: list[list[int]], message: str
) -> None:
    data = _set(SPECULATIVE, "speculative.num_speculative_tokens_per_batch_size", table)
    with pytest.raises(ManifestError, match=f"\n  speculative: .*{message}"):
        load_manifest(write_manifest(data))


def test_the_dynamic_example_loads_with_its_table() -> None:
    spec = load_manifest(pool_path("standard").parent / "examples" / "dynamic-eagle3-llama8b.yaml").speculative
    assert spec is not None and spec.num_speculative_tokens_per_batch_size is not None
    assert spec.num_speculative_tokens_per_batch_size[-1] == (97, 128, 0)
