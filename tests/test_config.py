"""Configuration: every bad input stops the run at start with the dotted key and what is allowed."""

import pytest

from harness.config.paths import REPO_ROOT
from harness.config.schema import ConfigError, load_method, resolve

DEFAULT = REPO_ROOT / "configs" / "sweeps" / "default.yaml"


def test_default_sweep_resolves_with_every_method():
    resolved = resolve(DEFAULT)
    assert resolved.sweep.preset == "tiny"
    assert resolved.preset.train.aggregation == "token-mean"
    assert (resolved.preset.train.clip_eps_low, resolved.preset.train.clip_eps_high) == (0.2, 0.28)
    assert resolved.preset.train.beta == 0.0
    assert set(resolved.preset.eval.benchmarks) == {"arith", "arith_ood"}


@pytest.mark.parametrize("override, expected", [
    ("train.learing_rate=1e-4", ["train.learing_rate", "allowed keys here", "learning_rate"]),
    ("train.learning_rate=fast", ["train.learning_rate", "could not be converted"]),
    ("train.aggregation=mean", ["train.aggregation", "token-mean", "seq-mean-token-mean"]),
    ("train.top_p=1.5", ["train.top_p", "[0.0, 1.0]"]),
    ("eval.k=0", ["eval.k", "outside the allowed range"]),
    ("eval.benchmarks.arith.scorer=regex", ["eval.benchmarks.arith.scorer", "math_verify"]),
    ("train.budget.kind=joules", ["train.budget.kind", "steps"]),
])
def test_bad_values_name_the_key_and_what_is_allowed(override, expected):
    with pytest.raises(ConfigError) as info:
        resolve(DEFAULT, [override])
    for fragment in expected:
        assert fragment in str(info.value)


def test_unknown_top_level_key_lists_allowed_ones():
    with pytest.raises(ConfigError, match="unknown top-level key.*'trian'.*allowed"):
        resolve({"name": "x", "preset": "tiny", "trian": {"learning_rate": 1e-4}})


def test_unknown_preset_lists_known_presets():
    with pytest.raises(ConfigError, match="no preset 'huge'.*tiny"):
        resolve({"name": "x", "preset": "huge"})


def test_unknown_method_label_lists_known_labels():
    with pytest.raises(ConfigError, match="unknown method label 'gmtz'.*known labels.*gmts"):
        resolve({"name": "x", "preset": "tiny", "methods": ["uniform", "gmtz"]})


def test_method_field_out_of_range_names_the_file():
    with pytest.raises(ConfigError, match="entropy.yaml.*rho"):
        load_method("entropy", ["rho=1.5"])


def test_snakemake_style_overrides_nested_and_set_string():
    resolved = resolve({"name": "x", "preset": "tiny", "train": {"learning_rate": "3e-4"},
                        "set": "eval.k=2 train.budget.amount=5"})
    assert resolved.preset.train.learning_rate == 3e-4
    assert resolved.preset.eval.k == 2
    assert resolved.preset.train.budget.amount == 5


def test_override_without_equals_is_rejected():
    with pytest.raises(ConfigError, match="expected key=value"):
        resolve(DEFAULT, ["train.learning_rate"])


def test_cli_reports_config_errors_with_exit_code_2(capsys):
    from harness.cli import main

    assert main(["data", "--set", "data.synthetic.terms=1"]) == 2
    assert "data.synthetic.terms" in capsys.readouterr().err
