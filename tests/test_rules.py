from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from gateway.errors import RulesError
from gateway.rules import Comparison, default_rules, default_rules_path, load_rules, parse_rules

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(
    p
    for p in REPO.rglob("*.yaml")
    if ".venv" not in p.parts and ".cache" not in p.parts and "rules" in p.name and "prometheus" not in p.parts
)


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(REPO)) for p in SHIPPED])
def test_every_shipped_rules_file_loads(path: Path) -> None:
    rules = load_rules(path)
    assert rules.rules, "a shipped rules file should route something"


def test_reference_policy_has_the_four_rules_in_order() -> None:
    rules = default_rules()
    names = [r.name for r in rules.rules]
    assert names[-3:] == ["short-output", "high-load", "draft-friendly-task"]
    assert rules.default_pool == "standard"
    assert {"code", "translation", "summarization", "chat"} <= set(rules.task_names())


BAD = [
    ({"rules": [{"name": "x", "pool": "fast"}]}, "rules.0.pool"),
    ({"rules": [{"name": "x", "pool": "standard", "when": {"max_tokenz": {"lt": 5}}}]}, "rules.0.when.max_tokenz"),
    (
        {"rules": [{"name": "x", "pool": "standard", "when": {"max_tokens": {"lt": "many"}}}]},
        "rules.0.when.max_tokens.lt",
    ),
    ({"rules": [{"name": "x", "pool": "standard", "when": {"max_tokens": {}}}]}, "rules.0.when.max_tokens"),
    ({"rules": [{"name": "x", "pool": "standard", "when": {"task": ["poetry"]}}]}, "rules.0.when.task"),
    ({"rules": [{"name": "a b", "pool": "standard"}]}, "rules.0.name"),
    ({"rules": [{"name": "a", "pool": "standard"}, {"name": "a", "pool": "speculative"}]}, "repeated: a"),
    ({"pools": {"standard": {"replicas": ["ftp://x"]}}}, "pools.standard.replicas"),
    ({"pools": {"turbo": {"replicas": []}}}, "pools.turbo"),
    ({"tasks": {"code": {"patterns": ["(unclosed"]}}}, "tasks.code.patterns"),
    ({"defaults": {"max_tokens": 0}}, "defaults.max_tokens"),
    (
        {"rules": [{"name": "x", "pool": "standard", "when": {"pools": {"speculative": {"waitng": 3}}}}]},
        "rules.0.when.pools.speculative.waitng",
    ),
    ({"unknown_top": 1}, "unknown_top"),
]


@pytest.mark.parametrize(("data", "path"), BAD, ids=[p for _, p in BAD])
def test_bad_rules_name_the_key(data: dict[str, object], path: str) -> None:
    with pytest.raises(RulesError) as info:
        parse_rules(data, "test.yaml")
    assert any(path in problem for problem in info.value.problems), info.value.problems


def test_yaml_syntax_error_is_a_rules_error(tmp_path: Path) -> None:
    bad = tmp_path / "rules.yaml"
    bad.write_text("rules: [\n  - name: x\n")
    with pytest.raises(RulesError, match="invalid YAML"):
        load_rules(bad)


def test_missing_file_is_a_rules_error(tmp_path: Path) -> None:
    with pytest.raises(RulesError, match="cannot read"):
        load_rules(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("spec", "value", "expected"),
    [
        ({"lt": 50}, 49, True),
        ({"lt": 50}, 50, False),
        ({"le": 50}, 50, True),
        ({"gt": 20}, 20, False),
        ({"gt": 20}, 20.5, True),
        ({"ge": 0.5, "lt": 1}, 0.5, True),
        ("code", "code", True),
        ("code", "chat", False),
        (["a", "b"], "b", True),
        ({"not_in": ["a"]}, "a", False),
        ({"ne": "a"}, "b", True),
        ({"lt": 5}, None, False),
        ({"lt": 5}, "3", False),
    ],
)
def test_comparison(spec: object, value: object, expected: bool) -> None:
    assert Comparison.model_validate(spec).matches(value) is expected  # type: ignore[arg-type]


def test_rules_check_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "check", str(default_rules_path())]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"rules": [{"name": "x", "pool": "standard", "when": {"qpss": 3}}]}))
    assert main(["rules", "check", str(bad)]) == 1
    assert "rules.0.when.qpss" in capsys.readouterr().err


def test_with_replicas_overrides_only_given_pools() -> None:
    rules = parse_rules(
        {"pools": {"standard": {"replicas": ["http://a:1"]}, "speculative": {"replicas": ["http://b:2/"]}}}
    )
    swapped = rules.with_replicas(["http://c:3"], [])
    assert swapped.pools["standard"].replicas == ("http://c:3",)
    assert swapped.pools["speculative"].replicas == ("http://b:2",)
