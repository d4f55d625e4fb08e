"""harness/model/decode.py decodes exactly as transformers' generate: the same sequences, the same logits at every
step (bit for bit), the same RNG state afterwards, on both of its step paths; and the rules that hand a call back
to transformers."""

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from harness.model import decode
from harness.model.checkpoints import load_policy

PROMPTS = ["Q: 1+2\n", "Q: 7-3+8-1+5\n", "Q: 4\n", "Q: 9+9-2\n", "Q: 3-8+1+2+6-4\n", "Q: 5+5\n"]


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    model, tokenizer = load_policy(tiny_model_dir)
    return model.eval(), tokenizer


@pytest.fixture(params=["decoder_layers", "model_forward"])
def step_path(request, policy):
    """The decode step: the plain LlamaForCausalLM's layers called directly, or (a forward hook on the model, which
    the direct call would skip) the model's full forward each step."""
    model, _ = policy
    handle = model.register_forward_pre_hook(lambda module, args: None) if request.param == "model_forward" else None
    assert decode.decoder_layer_step_applies(model) is (handle is None)
    yield request.param
    if handle is not None:
        handle.remove()


class Recorder(LogitsProcessor):
    """Keeps a copy of the scores it is given (the float32 logits of each step) and changes nothing."""

    def __init__(self):
        self.seen = []

    def __call__(self, input_ids, scores):
        self.seen.append(scores.clone())
        return scores


def run(generate, seed: int, **kwargs):
    """(sequences, per-step logits, RNG state after the call) of one generate call under ``seed``."""
    recorder = Recorder()
    torch.manual_seed(seed)
    with torch.no_grad():
        out = generate(**kwargs, logits_processor=LogitsProcessorList([recorder]))
    return out, recorder.seen, torch.get_rng_state()


def assert_identical(model, seed: int, **kwargs):
    """decode.generate gives what model.generate gives; returns the sequences."""
    ours = run(lambda **k: decode.generate(model, **k), seed, **kwargs)
    theirs = run(model.generate, seed, **kwargs)
    assert torch.equal(ours[0], theirs[0])
    assert len(ours[1]) == len(theirs[1]) and all(torch.equal(a, b) for a, b in zip(ours[1], theirs[1], strict=True))
    assert torch.equal(ours[2], theirs[2])  # the same draws: everything downstream samples the same numbers
    return theirs[0]


def left_padded(tokenizer, prompts=PROMPTS):
    batch = tokenizer(prompts, add_special_tokens=False, padding=True, return_tensors="pt")
    assert tokenizer.padding_side == "left" and (batch["attention_mask"] == 0).any()
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def trl_config(tokenizer, eos_ids, **overrides) -> GenerationConfig:
    """GenerationConfig as TRL 1.16's GRPOTrainer builds it for the transformers path (grpo_trainer.py)."""
    settings = {"max_new_tokens": 24, "do_sample": True, "pad_token_id": tokenizer.pad_token_id,
                "bos_token_id": tokenizer.bos_token_id, "eos_token_id": eos_ids, "temperature": 1.0, "top_p": 1.0,
                "top_k": 0, "min_p": None, "repetition_penalty": 1.0, "cache_implementation": None}
    return GenerationConfig(**{**settings, **overrides}, disable_compile=True)


def frequent_tokens(model, tokenizer, n: int) -> list[int]:
    """``n`` tokens the random model samples often: as EOS ids they end rows at different steps."""
    out = run(model.generate, 0, **left_padded(tokenizer), generation_config=trl_config(tokenizer, [1]))[0]
    counts = torch.bincount(out[:, -24:].flatten(), minlength=len(tokenizer))
    counts[tokenizer.all_special_ids] = 0
    return counts.argsort(descending=True)[:n].tolist()


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.7, "top_p": 0.9}, {"temperature": 1.3, "top_k": 20}])
def test_sampled_rollouts_as_trl_asks_for_them(policy, step_path, seed, sampling):
    model, tokenizer = policy
    # several EOS ids, as TRL allows: two sampled often enough that some rows end early (checked below)
    eos_ids = [tokenizer.eos_token_id, *frequent_tokens(model, tokenizer, 11)[5::5]]
    out = assert_identical(model, seed, **left_padded(tokenizer),
                           generation_config=trl_config(tokenizer, eos_ids, **sampling))
    completions = out[:, -24:]
    finished = torch.isin(completions, torch.tensor(eos_ids)).any(dim=1)
    if seed == 0 and not sampling:  # the case is exercised: rows end mid-batch, padded after; others run to the end
        assert finished.any() and not finished.all()
        assert (completions == tokenizer.pad_token_id).any()


@pytest.mark.parametrize("max_new_tokens", [1, 2, 17])
def test_max_length_is_reached_with_unfinished_rows(policy, step_path, max_new_tokens):
    model, tokenizer = policy
    out = assert_identical(model, 3, **left_padded(tokenizer),
                           generation_config=trl_config(tokenizer, [tokenizer.eos_token_id],
                                                        max_new_tokens=max_new_tokens))
    assert out.shape[1] == left_padded(tokenizer)["input_ids"].shape[1] + max_new_tokens


def test_prompts_of_one_length_have_no_attention_mask(policy, step_path):
    # the default sweep's case: generate drops an all-ones mask, and the step then passes none
    model, tokenizer = policy
    batch = tokenizer(["Q: 1+2-3\n", "Q: 4-5+6\n"] * 3, add_special_tokens=False, return_tensors="pt")
    assert bool((batch["attention_mask"] == 1).all())
    assert_identical(model, 1, input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     generation_config=trl_config(tokenizer, [tokenizer.eos_token_id]))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("do_sample", [False, True])
def test_lm_eval_calls_with_stop_sequences(policy, step_path, seed, do_sample):
    # HFLM._model_generate: no attention mask (generate infers it from the padding), max_length, lm-eval's stateful
    # stop-sequence criteria (a fresh set per call), pad_token_id, use_cache
    from lm_eval.models.utils_hf import stop_sequences_criteria

    model, tokenizer = policy
    context = left_padded(tokenizer)["input_ids"]
    common = frequent_tokens(model, tokenizer, 2)
    stops = [tokenizer.decode([common[0]]), tokenizer.decode([common[1]]), "\nQ:"]  # two the model often samples
    sampling = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0} if do_sample else {"do_sample": False}

    trackers = []

    def call(generate, **kwargs):
        criteria = stop_sequences_criteria(tokenizer, stops, context.shape[1], context.shape[0])
        trackers.append(criteria)
        return generate(input_ids=context, max_length=context.shape[1] + 20, stopping_criteria=criteria,
                        pad_token_id=tokenizer.pad_token_id, use_cache=True, repetition_penalty=1.0, **sampling,
                        **kwargs)

    ours = run(lambda **k: call(lambda **a: decode.generate(model, **a), **k), seed)
    theirs = run(lambda **k: call(model.generate, **k), seed)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[2], theirs[2])
    assert all(torch.equal(a, b) for a, b in zip(ours[1], theirs[1], strict=True))
    # the stateful criteria saw the same rows: the same stop strings found in the same rows
    done = [[c.done_tracker for c in criteria] for criteria in trackers]
    assert done[0] == done[1]
    if do_sample and seed == 0:  # exercised: some rows found a stop string, others not
        assert any(any(d) and not all(d) for d in done[0])


def test_generating_with_sample_replaces_generate_only_inside(policy):
    model, tokenizer = policy
    kwargs = {**left_padded(tokenizer), "generation_config": trl_config(tokenizer, [tokenizer.eos_token_id])}
    theirs = run(model.generate, 2, **kwargs)
    with decode.generating_with_sample(model):
        assert "generate" in vars(model)
        ours = run(model.generate, 2, **kwargs)
        with pytest.raises(RuntimeError, match="already replaced"), decode.generating_with_sample(model):
            pass
    assert "generate" not in vars(model)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[2], theirs[2])


def test_calls_it_cannot_decode_go_to_transformers(policy):
    # return_dict_in_generate: transformers' own loop runs, so scores come back as generate returns them
    model, tokenizer = policy
    batch = left_padded(tokenizer)
    config = trl_config(tokenizer, [tokenizer.eos_token_id], return_dict_in_generate=True, output_scores=True)
    ours = run(lambda **k: decode.generate(model, **k), 0, **batch, generation_config=config)[0]
    theirs = run(model.generate, 0, **batch, generation_config=config)[0]
    assert torch.equal(ours.sequences, theirs.sequences)
    assert all(torch.equal(a, b) for a, b in zip(ours.scores, theirs.scores, strict=True))
    # beam search is not decoded here at all
    with pytest.raises(ValueError, match="greedy or sampled"):
        decode.generate(model, **batch, generation_config=trl_config(tokenizer, [1], do_sample=False, num_beams=2))


def test_fallback_rules_name_the_reason(policy):
    from transformers.cache_utils import DynamicCache, StaticCache

    model, tokenizer = policy
    config = trl_config(tokenizer, [1])
    config.max_length = 30
    position_ids = torch.zeros((2, 3), dtype=torch.long)
    fresh = {"cache": DynamicCache(config=model.config), "use_cache": True, "position_ids": position_ids,
             "attention_mask": None, "logits_to_keep": 1}
    assert decode.fallback_reason(model, config, fresh) is None
    assert "inputs_embeds" in decode.fallback_reason(model, config, {**fresh, "inputs_embeds": torch.zeros(1)})
    static = StaticCache(config=model.config, max_cache_len=30)
    assert "StaticCache" in decode.fallback_reason(model, config, {**fresh, "cache": static})
    assert "cache" in decode.fallback_reason(model, config, {**fresh, "use_cache": False})
    scores = trl_config(tokenizer, [1], return_dict_in_generate=True, output_scores=True)
    assert "return_dict_in_generate" in decode.fallback_reason(model, scores, fresh)


@pytest.mark.parametrize("architecture", ["llama_gqa", "qwen2"])
def test_other_architectures(policy, architecture, monkeypatch):
    # grouped-query attention (SmolLM2's and Qwen2.5's layout) through the decoder-layer step, and a model class
    # other than LlamaForCausalLM (Qwen2: biased projections) through its full forward each step
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    _, tokenizer = policy
    sizes = {"vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "pad_token_id": tokenizer.pad_token_id,
             "eos_token_id": tokenizer.eos_token_id}
    torch.manual_seed(0)
    model = (LlamaForCausalLM(LlamaConfig(**sizes)) if architecture == "llama_gqa"
             else Qwen2ForCausalLM(Qwen2Config(**sizes))).eval()
    assert decode.decoder_layer_step_applies(model) is (architecture == "llama_gqa")
    for seed, sampling in enumerate([{}, {"do_sample": False}, {"temperature": 0.7, "top_p": 0.9}]):
        assert_identical(model, seed, **left_padded(tokenizer),
                         generation_config=trl_config(tokenizer, [tokenizer.eos_token_id], **sampling))
    with monkeypatch.context() as patch:  # decoded by decode.sample itself, not handed to transformers' loop
        patch.setattr(type(model), "_sample", lambda *a, **k: pytest.fail("transformers' _sample ran"))
        decode.generate(model, **left_padded(tokenizer), generation_config=trl_config(tokenizer, [1]))
