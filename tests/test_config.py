"""Configuration: every bad input stops the run at start with the dotted key and what is allowed."""

import dataclasses
import math

import pytest

from harness.config.loading import load_method, resolve
from harness.config.paths import REPO_ROOT
from harness.config.schema import ConfigError

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
        resolve({"name": "x", "preset": "huge", "methods": ["uniform"], "seeds": [0]})


def test_unknown_method_label_lists_known_labels():
    with pytest.raises(ConfigError, match="unknown method label 'gmtz'.*known labels.*gmts"):
        resolve({"name": "x", "preset": "tiny", "methods": ["uniform", "gmtz"], "seeds": [0]})


def test_method_field_out_of_range_names_the_file():
    with pytest.raises(ConfigError, match="entropy.yaml.*rho"):
        load_method("entropy", ["rho=1.5"])


@pytest.mark.parametrize("rho, accepted", [(0.0, False), (math.nan, False), (math.inf, False), (1.5, False),
                                           (1.0, True), (1e-9, True)])
def test_a_method_setting_outside_its_declared_range_is_refused_with_its_key(rho, accepted):
    from methods.entropy import Entropy

    if accepted:
        assert Entropy.Config(rho=rho).rho == rho
    else:
        with pytest.raises(ValueError, match=r"^key 'method.rho': .* is outside the allowed range \(0.0, 1.0\]$"):
            Entropy.Config(rho=rho)


def test_a_method_label_override_outside_the_declared_range_names_the_file_and_key():
    with pytest.raises(ConfigError, match=r"entropy.yaml.*key 'method.rho': 0.0 is outside the allowed range "
                                          r"\(0.0, 1.0\]"):
        load_method("entropy", ["rho=0"])
    assert load_method("entropy", ["rho=1.0"]).params.rho == 1.0


def test_declared_ranges_refuse_nan_and_infinity_skip_null_and_show_open_ends():
    from methods.declaration import declared_problems, setting

    @dataclasses.dataclass
    class Example:
        count: int = setting(1, "at least one", low=1)
        share: float = setting(0.5, "strictly between 0 and 1", low=0.0, low_open=True, high=1.0, high_open=True)
        free: float = setting(0.5, "no range: not checked")
        cap: float | None = setting(None, "null = none", low=0.0)

    assert declared_problems(Example(free=math.nan)) == []
    assert declared_problems(Example(count=0, share=1.0, cap=-1.0), "x.") == [
        "key 'x.count': 0 is outside the allowed range [1, inf)",
        "key 'x.share': 1.0 is outside the allowed range (0.0, 1.0)",
        "key 'x.cap': -1.0 is outside the allowed range [0.0, inf)"]
    assert declared_problems(Example(share=math.nan, cap=math.inf)) == [
        "key 'share': nan is outside the allowed range (0.0, 1.0)",
        "key 'cap': inf is outside the allowed range [0.0, inf)"]


def test_snakemake_style_overrides_nested_and_set_string():
    resolved = resolve({"name": "x", "preset": "tiny", "methods": ["uniform"], "seeds": [0],
                        "train": {"learning_rate": "3e-4"}, "set": "eval.k=2 train.budget.amount=5"})
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


# --- the closed sets of names: defined once, implemented by their modules -----------------------------------------


def test_schema_choices_are_the_owners_names():
    from harness.config import choices
    from harness.config.schema import BenchmarkConfig, BudgetConfig, PresetConfig, TrainConfig
    from methods.base import AGGREGATIONS
    from methods.declaration import declared

    assert declared(TrainConfig, "aggregation").choices is AGGREGATIONS
    assert declared(TrainConfig, "reward").choices is choices.SCORERS
    assert declared(BenchmarkConfig, "scorer").choices is choices.SCORERS
    assert declared(BudgetConfig, "kind").choices is choices.BUDGET_KINDS
    assert declared(PresetConfig, "prompt_template").choices is choices.PROMPT_TEMPLATES


def test_every_prompt_template_renders():
    from harness.config.choices import PROMPT_TEMPLATES
    from harness.data.prompts import render_prompt

    class ChatTokenizer:
        chat_template = "{{ messages }}"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return f"<chat>{messages[0]['content']}"

    for template in PROMPT_TEMPLATES:
        assert "2+2" in render_prompt(template, "2+2", tokenizer=ChatTokenizer())
    with pytest.raises(ValueError, match="prompt_template must be one of"):
        render_prompt("nonesuch", "2+2")


def test_every_scorer_and_budget_kind_is_implemented():
    from harness.config.choices import BUDGET_KINDS, SCORERS
    from harness.data.scoring import score_batch
    from harness.train.budget import BudgetLedger

    for scorer in SCORERS:  # an empty batch reaches the scorer's branch without starting a math-verify worker
        assert score_batch([], [], scorer, 1.0) == []
    with pytest.raises(ValueError, match="known scorers"):
        score_batch([], [], "regex", 1.0)
    ledger = BudgetLedger(steps=3, samples=24)
    assert {kind: ledger.spent(kind) for kind in BUDGET_KINDS}["steps"] == 3.0
    with pytest.raises(ValueError, match="budget kind must be one of"):
        ledger.spent("joules")


# --- one declaration per setting, and the reference generated from them -------------------------------------------


def schema_fields(cls: type) -> list:
    """(class, field) of every field of a schema class and of the schemas nested in it."""
    out = []
    for f in dataclasses.fields(cls):
        out.append((cls, f))
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            out += schema_fields(type(default))
    return out


def test_every_setting_is_declared_with_its_documentation():
    from harness.config.schema import BenchmarkConfig, PresetConfig, SweepConfig
    from methods.declaration import declaration

    fields = [*schema_fields(SweepConfig), *schema_fields(PresetConfig), *schema_fields(BenchmarkConfig)]
    undocumented = [f"{cls.__name__}.{f.name}" for cls, f in fields if not declaration(f).doc
                    and not (f.default_factory is not dataclasses.MISSING
                             and dataclasses.is_dataclass(f.default_factory()))]
    assert undocumented == []


def test_every_method_setting_is_declared_with_its_documentation():
    from harness.config.reference import builtin_methods
    from methods.declaration import declaration

    undocumented = [f"{name}.{f.name}" for name, cls in builtin_methods().items()
                    for f in dataclasses.fields(cls.Config) if not declaration(f).doc]
    assert undocumented == []


def test_a_list_default_is_not_shared_between_instances():
    from harness.config.schema import SweepConfig

    first, second = SweepConfig(), SweepConfig()
    first.methods.append("entropy")
    assert second.methods == ["uniform"]


def test_the_committed_config_reference_is_generated_from_the_declarations():
    from harness.config.reference import reference

    generated = reference()
    for key in ("train.budget.checkpoint_fractions", "eval.benchmarks.<name>.scorer", "resources.train.gpus"):
        assert f"| `{key}` |" in generated
    # a method field's declaration: its range, choices and documentation
    assert "| `q` | float | `0.5` | (0.0, 1.0] | URS inclusion probability" in generated
    assert "| `scheme` | str | `\"rpc\"` | `rpc`, `urs` | Token sampling scheme." in generated
    assert "| `bm25_k1` | float | `2.0` | > 0.0 | BM25 k1" in generated
    committed = (REPO_ROOT / "docs" / "config-reference.md").read_text(encoding="utf-8")
    assert committed == generated, "stale: run python -m harness.config.reference > docs/config-reference.md"
