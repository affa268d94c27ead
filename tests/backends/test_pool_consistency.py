"""The two pools against each other, and the pools against the gateway's rules file."""

from __future__ import annotations

from typing import Any

from backends.consistency import check_against_rules, check_pair
from backends.manifest import PoolManifest, load_manifest, pool_path
from gateway.rules import parse_rules


def pair(cpu: bool = False) -> dict[str, PoolManifest]:
    return {pool: load_manifest(pool_path(pool, cpu=cpu)) for pool in ("standard", "speculative")}


def rules(**overrides: Any) -> Any:
    data: dict[str, Any] = {"pools": {"standard": {"replicas": []}, "speculative": {"replicas": []}}}
    data.update(overrides)
    return parse_rules(data)


def test_shipped_pairs_agree_with_each_other_and_the_shipped_rules() -> None:
    for cpu in (False, True):
        pools = pair(cpu)
        assert check_pair(pools["standard"], pools["speculative"]) == []
        assert check_against_rules(pools, rules()) == []


def test_pools_serving_different_models_are_an_error() -> None:
    pools = pair()
    other = pools["speculative"].model_copy(update={"model": "other/model", "served_model_name": "other",
                                                    "max_model_len": 4096})
    findings = check_pair(pools["standard"], other)
    assert [f.level for f in findings] == ["error", "error", "warning"]
    assert "different models" in findings[0].message
    assert "different served_model_name" in findings[1].message
    assert "max_model_len differs" in findings[2].message


def test_rules_missing_a_pool_or_naming_an_unknown_one() -> None:
    pools = pair()
    only_standard = rules(pools={"standard": {"replicas": []}})
    (finding,) = check_against_rules(pools, only_standard)
    assert finding.level == "error" and "no pool 'speculative'" in finding.message
    (finding,) = check_against_rules({"standard": pools["standard"]}, rules())
    assert finding.level == "error" and "names pool 'speculative' but no manifest defines it" in finding.message


def test_rules_models_must_include_the_served_name() -> None:
    pools = pair(cpu=True)
    findings = check_against_rules(pools, rules(models=["llama-3.1-8b-instruct"]))
    assert len(findings) == 2 and all(f.level == "error" for f in findings)
    assert "'smollm2-135m-instruct' is not in the rules file's models" in findings[0].message
    assert check_against_rules(pools, rules(models=["smollm2-135m-instruct"])) == []


def test_replica_count_difference_is_a_warning() -> None:
    pools = pair()  # two replicas each
    findings = check_against_rules(pools, rules(pools={"standard": {"replicas": ["http://a:8000"]},
                                                       "speculative": {"replicas": []}}))
    assert [(f.level, f.message) for f in findings] == [
        ("warning", "standard: rules file lists 1 replica URL(s), manifest launches 2 replica(s)")]
