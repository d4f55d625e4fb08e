"""Peak memory per device of the GPU jobs (harness/config/memory.py): the analytic model on hand-checkable cases,
the sweep's start and ``harness plan`` refusing a preset that does not fit, and every paper sweep fitting 80 GiB."""

from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.config.loading import resolve
from harness.config.memory import (
    ARCHITECTURES,
    GIB,
    architecture,
    chunk_tokens,
    gpu_memory,
    grad_chunk_bytes,
    layer_activation_bytes,
    memory_problems,
    training_memory,
)
from harness.config.paths import CONFIG_DIR
from harness.config.schema import ConfigError

SWEEPS = CONFIG_DIR / "sweeps"
# Qwen/Qwen2.5-0.5B's config.json (the dimensions a local directory's file gives; no hub access here)
QWEN2_0_5B = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
              "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
              "max_position_embeddings": 32768}
PAPER_SWEEPS = ("paper-8020", "paper-d3s", "paper-gmts", "paper-ktae", "paper-ktae-grpo", "paper-nat", "paper-rsi",
                "head-to-head")  # and the project's own GPU sweep


@pytest.mark.parametrize(("model", "total", "non_embedding"), [
    ("Qwen/Qwen3-8B-Base", 8.19e9, 6.95e9),  # the Qwen3-8B card: 8.2B, 6.95B non-embedding
    ("Qwen/Qwen2.5-Math-7B", 7.61e9, 6.53e9),  # the Qwen2.5-7B card: 7.61B, 6.53B
    ("Qwen/Qwen2.5-Math-1.5B", 1.54e9, 1.31e9),  # the Qwen2.5-1.5B card: 1.54B, 1.31B (tied)
    ("Qwen/Qwen2.5-1.5B", 1.54e9, 1.31e9),
])
def test_the_table_gives_the_model_cards_parameter_counts(model, total, non_embedding):
    arch = ARCHITECTURES[model]
    embeddings = arch.embedding_parameters * (1 if arch.tie_word_embeddings else 2)
    assert arch.parameters == pytest.approx(total, rel=0.005)
    assert arch.parameters - embeddings == pytest.approx(non_embedding, rel=0.005)


def test_kv_cache_bytes_per_token_by_hand():
    qwen3 = ARCHITECTURES["Qwen/Qwen3-8B-Base"]
    assert qwen3.kv_bytes_per_token(2) == 2 * 36 * 8 * 128 * 2  # keys and values, 36 layers, 8 KV heads of 128
    assert qwen3.kv_bytes_per_token(2, tensor_parallel=2) == 2 * 36 * 4 * 128 * 2
    qwen25 = ARCHITECTURES["Qwen/Qwen2.5-Math-1.5B"]
    assert qwen25.kv_bytes_per_token(2, tensor_parallel=4) == 2 * 28 * 1 * 128 * 2  # 2 KV heads replicated over 4


def test_ddp_holds_full_float32_state_and_zero3_shards_it():
    ktae = resolve(SWEEPS / "paper-ktae.yaml").preset  # ddp over 4 GPUs, Qwen2.5-Math-1.5B, bf16 over fp32
    n = ARCHITECTURES["Qwen/Qwen2.5-Math-1.5B"].parameters
    parts = training_memory(ktae, architecture(ktae.model), needs_reference=False).parts
    assert parts["weights"] == parts["gradients"] == parts["DDP gradient buckets"] == 4 * n
    assert parts["AdamW state"] == 8 * n
    assert parts["autocast weight cache"] == 2 * n  # tied: the head's cast covers the embedding
    assert "reference model" not in parts
    d3s = resolve(SWEEPS / "paper-d3s.yaml").preset  # ZeRO-3 over 8 GPUs, Qwen2.5-Math-7B
    n7 = ARCHITECTURES["Qwen/Qwen2.5-Math-7B"].parameters
    sharded = training_memory(d3s, architecture(d3s.model), needs_reference=True).parts
    assert sharded["AdamW state (shard)"] == 8 * n7 / 8
    assert sharded["weights (bf16 shard + float32 master shard)"] == 6 * n7 / 8
    assert sharded["reference model"] == 2 * n7 / 8
    assert "autocast weight cache" not in sharded and "DDP gradient buckets" not in sharded


def test_checkpointed_activations_keep_one_residual_per_layer_and_token():
    arch = ARCHITECTURES["Qwen/Qwen2.5-Math-1.5B"]
    one, two = (grad_chunk_bytes(arch, tokens, 4, 2, checkpointing=True) for tokens in (1000, 2000))
    assert two == 2 * one  # linear in the chunk's tokens
    without = grad_chunk_bytes(arch, 1000, 4, 2, checkpointing=False)
    # checkpointing keeps each of the 28 layers' float32 input (1536 x 4 bytes per token) and recomputes one layer,
    # where no checkpointing keeps all 28 layers' activations
    assert without - one == 1000 * (27 * layer_activation_bytes(arch, 4, 2) - 28 * 1536 * 4)


@pytest.mark.parametrize("sweep", PAPER_SWEEPS)
def test_every_paper_sweep_fits_80_gib(sweep):
    resolved = resolve(SWEEPS / f"{sweep}.yaml")  # the start would refuse one that does not fit
    rows = gpu_memory(resolved.preset)
    assert [m.rule for m in rows] == ["train", "eval"]
    assert all(m.fits and m.device_bytes == 80 * GIB for m in rows), [(m.rule, m.total / GIB) for m in rows]


def test_the_8b_presets_vllm_share_holds_several_max_length_rollouts():
    for sweep in ("paper-8020", "paper-nat"):
        notes = " ".join(gpu_memory(resolve(SWEEPS / f"{sweep}.yaml").preset)[0].notes)
        sequences = float(notes.split(" sequences of ")[0].rsplit(" ", 1)[1])
        assert sequences >= 7  # 0.35 of the GPU held 3.5 rollouts of 22.5k tokens (paper-8020)


def test_the_start_refuses_a_chunk_that_does_not_fit_naming_preset_rule_figure_and_fix():
    with pytest.raises(ConfigError) as error:
        resolve(SWEEPS / "paper-rsi.yaml", ["train.backward_chunk_rows=32"])
    message = str(error.value)
    assert "preset 'paper-rsi', rule train: peak 123.1 GiB per device exceeds resources.device_memory_gb=80" in message
    assert "backward chunk of 32 row(s)" in message and "lower train.backward_chunk_rows" in message


def test_a_smaller_device_refuses_what_80_gib_holds():
    assert not memory_problems(resolve(SWEEPS / "paper-gmts.yaml").preset)
    # pure bf16 (Framework1's precision) needs 33.5 GiB with a 0.3 vLLM share of a 32 GiB device (it fits on 40)
    with pytest.raises(ConfigError, match=r"peak 33.5 GiB per device exceeds resources.device_memory_gb=32"):
        resolve(SWEEPS / "paper-gmts.yaml", ["resources.device_memory_gb=32"])


def test_a_vllm_share_without_room_for_one_sequence_is_refused():
    with pytest.raises(ConfigError, match="less than one 22528-token sequence .* raise train.vllm_gpu_memory_util"):
        resolve(SWEEPS / "paper-8020.yaml", ["train.vllm_gpu_memory_utilization=0.23"])


def test_harness_plan_prints_the_peak_and_fails_on_a_preset_that_does_not_fit(capsys):
    assert main(["plan", "--sweep", str(SWEEPS / "paper-8020.yaml")]) == 0
    out = capsys.readouterr().out
    assert "peak memory per device (Qwen/Qwen3-8B-Base" in out and "train: 73.7 GiB of 80 (fits" in out
    assert "7.4 sequences of 22528 tokens" in out
    assert main(["plan", "--sweep", str(SWEEPS / "paper-8020.yaml"), "--set", "train.forward_chunk_rows=16",
                 "--set", "train.forward_chunk_tokens=0"]) == 2
    err = capsys.readouterr().err
    assert "rule train: peak" in err and "no-grad forward chunk of 16 row(s)" in err
    # the preset's token cap: 64 rows of which at most 4 full-length ones (90,112 tokens); 16 at full length fail
    assert main(["plan", "--sweep", str(SWEEPS / "paper-8020.yaml"), "--set",
                 f"train.forward_chunk_tokens={16 * 22528}"]) == 2
    assert f"no-grad forward chunk of up to {16 * 22528} tokens" in capsys.readouterr().err


def test_a_token_cap_bounds_a_chunk_at_the_cap_or_one_longer_row():
    assert chunk_tokens(16, 0, 1000) == 16_000  # rows alone
    assert chunk_tokens(16, 4500, 1000) == 4500  # 4 full rows fit; shorter rows fill up to the cap
    assert chunk_tokens(16, 500, 1000) == 1000  # a row longer than the cap runs alone
    assert chunk_tokens(2, 4500, 1000) == 2000  # the row cap binds first


def test_cpu_presets_have_no_gpu_rule_to_size():
    assert gpu_memory(resolve(SWEEPS / "default.yaml").preset) == []


def test_a_local_model_directory_is_sized_from_its_config_json_and_a_missing_key_is_named(tmp_path):
    model = resolve(SWEEPS / "paper-nat.yaml").preset.model
    model.name_or_path = str(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_0_5B))
    arch = architecture(model)
    assert (arch.hidden_size, arch.head_dim, arch.num_key_value_heads, arch.attention_bias) == (896, 64, 2, True)
    assert arch.tie_word_embeddings
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in QWEN2_0_5B.items() if k != "vocab_size"}))
    with pytest.raises(ConfigError, match=r"config\.json: .*has no vocab_size"):
        architecture(model)
