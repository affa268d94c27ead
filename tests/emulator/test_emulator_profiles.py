from __future__ import annotations

from pathlib import Path

import pytest

from backends.emulator.profiles import (
    ProfileError,
    dynamic_profile,
    dynamic_table,
    load_profile,
    shipped_profiles,
    with_dynamic_k,
)
from backends.emulator.timing import TimingModel


def test_the_three_issue_profiles_ship() -> None:
    assert {"a100-70b-draft", "h100-8b", "cpu-smollm2"} <= set(shipped_profiles())


@pytest.mark.parametrize("name", shipped_profiles())
def test_every_shipped_profile_loads_and_documents_its_source(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name
    assert len(profile.source) > 80
    assert profile.targets


def test_the_fitted_cpu_profile_is_cpu_smollm2_with_the_measured_step_costs() -> None:
    """backends/emulator/profiles/fitted/: written by `specgate bench step-cost --profile-out` on the real CPU
    engine; not a shipped profile (`--profile all` leaves it out), read by path."""
    fitted = load_profile(Path(__file__).parents[2] / "backends/emulator/profiles/fitted/cpu-smollm2-1core.yaml")
    base = load_profile("cpu-smollm2")
    assert fitted.name not in shipped_profiles() and "step-cost" in fitted.source
    assert fitted.speculative.draft_cost_ratio < base.speculative.draft_cost_ratio
    assert fitted.speculative.verify_cost_ratio < 1.0
    assert fitted.step.overhead_s > base.step.overhead_s  # one core per engine: a larger fixed step
    assert fitted.acceptance_model == base.acceptance_model and fitted.kv_capacity_tokens == base.kv_capacity_tokens


def test_a_misspelt_key_fails_naming_its_path(tmp_path: Path) -> None:
    text = (Path(__file__).parents[2] / "backends/emulator/profiles/h100-8b.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("t_mem_s:", "t_mem_ms:"))
    with pytest.raises(ProfileError, match=r"step\.t_mem_ms: Extra inputs are not permitted"):
        load_profile(bad)


def test_an_unknown_profile_names_the_shipped_ones() -> None:
    with pytest.raises(ProfileError, match="cpu-smollm2"):
        load_profile("tpu-9000")


def test_a_kv_cache_smaller_than_one_request_is_rejected(tmp_path: Path) -> None:
    text = (Path(__file__).parents[2] / "backends/emulator/profiles/h100-8b.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("kv_capacity_tokens: 430000", "kv_capacity_tokens: 100"))
    with pytest.raises(ProfileError, match="kv_capacity_tokens must hold"):
        load_profile(bad)


def test_emulate_cli_rejects_bad_arguments_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    assert main(["emulate", "--standard", "--profile", "tpu-9000"]) == 2
    assert "no emulator profile" in capsys.readouterr().out
    assert main(["emulate", "--standard", "--workload", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["emulate", "--standard", "--speed", "0"])
    assert "must be positive" in capsys.readouterr().err


def test_the_dynamic_table_drafts_by_batch_size_and_names_itself() -> None:
    assert dynamic_table(5) == ((1, 8, 5), (9, 32, 2), (33, 33, 0))
    assert dynamic_table(1) == ((1, 8, 1), (9, 32, 1), (33, 33, 0))
    shipped = load_profile("h100-8b")
    dynamic = dynamic_profile(shipped)
    model = TimingModel(dynamic, speculative=True)
    assert [model.k_for(b) for b in (1, 8, 9, 32, 33, 256)] == [5, 5, 2, 2, 0, 0]
    assert shipped.speculative.num_speculative_tokens_per_batch_size is None  # the shipped profile is untouched
    assert dynamic.name == "h100-8b+dynamic-k" and dynamic_profile(dynamic) == dynamic
    assert dynamic.step == shipped.step and dynamic.acceptance_model == shipped.acceptance_model


def test_a_table_of_ones_own_is_named_in_the_profile_and_checked_against_its_k() -> None:
    shipped = load_profile("h100-8b")
    own = dynamic_profile(shipped, ((1, 32, 5), (33, 64, 2), (65, 65, 0)))
    assert own.name == "h100-8b+k=1-32:5,33-64:2,65-65:0"
    assert TimingModel(own, speculative=True).k_for(40) == 2
    with pytest.raises(ProfileError, match=r"h100-8b\+k=1-8:9: speculative: .*between 0 and num_speculative_tokens"):
        dynamic_profile(shipped, ((1, 8, 9),))


def test_the_one_pool_baseline_runs_the_speculative_pools_own_table_else_the_stated_one() -> None:
    shipped = load_profile("h100-8b")
    assert with_dynamic_k(shipped) == dynamic_profile(shipped)
    own = dynamic_profile(shipped, ((1, 4, 5), (5, 5, 0)))
    assert with_dynamic_k(own) is own
