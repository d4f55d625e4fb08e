"""harness.evaluation.stopping.StopSequences decides as lm-eval's stop_sequences_criteria, step by step."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lm_eval.models.utils_hf import stop_sequences_criteria as lm_eval_criteria

from harness.evaluation.stopping import stop_sequences_criteria


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def decisions(criteria, sequences: torch.Tensor, prompt_length: int) -> list[bool]:
    """The batch-level stop decision after each generated token, as generate asks for it."""
    return [bool(criteria(sequences[:, :end], None).all()) for end in range(prompt_length + 1,
                                                                             sequences.shape[1] + 1)]


def batch(tokenizer, texts: list[str], prompt: str = "Q: 1+2\nA:") -> torch.Tensor:
    rows = [tokenizer.encode(prompt + text, add_special_tokens=False) for text in texts]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows])


@pytest.mark.parametrize("texts, stops", [
    ([" 3\nQ: 2+2", " 3\nQ:", " 33"], ["\nQ:"]),  # one row never stops: the batch runs on
    ([" 3\nQ: 5", "\nQ:", " 4 4\nQ: 7+1"], ["\nQ:"]),  # all rows stop, at different steps
    ([" 3\nQ:", " 3 A", " 3\nQ:"], ["\nQ:", "A"]),  # done for different strings does not add up
    ([" 3\nQ: A", " A 3\nQ:", " 3"], ["\nQ:", "A"]),
    ([" 3", " 4"], []),
])
def test_same_decisions_as_lm_eval(tokenizer, texts, stops):
    prompt_length = len(tokenizer.encode("Q: 1+2\nA:", add_special_tokens=False))
    sequences = batch(tokenizer, texts)
    ours = decisions(stop_sequences_criteria(tokenizer, stops, prompt_length, len(texts)), sequences, prompt_length)
    theirs = decisions(lm_eval_criteria(tokenizer, stops, prompt_length, len(texts)), sequences, prompt_length)
    assert ours == theirs
    if stops == ["\nQ:"] and texts[1] == "\nQ:":
        assert ours[-1] and not ours[0]  # the case does stop, and not at once


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(alphabet="0123456789+\nQA: ", max_size=12), min_size=1, max_size=5),
       stops=st.lists(st.sampled_from(["\nQ:", "A", "\n", "12"]), max_size=3, unique=True))
def test_same_decisions_on_any_text(tokenizer, texts, stops):
    prompt_length = len(tokenizer.encode("Q: 1+2\nA:", add_special_tokens=False))
    sequences = batch(tokenizer, texts)
    if sequences.shape[1] == prompt_length:
        return  # nothing generated
    ours = decisions(stop_sequences_criteria(tokenizer, stops, prompt_length, len(texts)), sequences, prompt_length)
    theirs = decisions(lm_eval_criteria(tokenizer, stops, prompt_length, len(texts)), sequences, prompt_length)
    assert ours == theirs


def test_generate_gives_the_same_tokens(tiny_model_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    context = batch(tokenizer, ["", "", "", ""], prompt="Q: 12+7\nA:")
    outputs = []
    for criteria in (lm_eval_criteria, stop_sequences_criteria):
        torch.manual_seed(0)
        outputs.append(model.generate(input_ids=context, max_length=context.shape[1] + 40, do_sample=True,
                                      temperature=1.0, top_k=0, stopping_criteria=criteria(
                                          tokenizer, ["\nQ:", "7"], context.shape[1], context.shape[0]),
                                      pad_token_id=tokenizer.pad_token_id, use_cache=True))
    assert torch.equal(outputs[0], outputs[1])


def test_lm_eval_hflm_builds_its_criteria_through_the_replaced_name():
    # the contract harness/evaluation/hflm.py relies on: HFLM._model_generate looks stop_sequences_criteria up in its
    # module at call time, so replacing the module's name for the call reaches it
    import lm_eval.models.huggingface as lm_eval_hf

    from harness.evaluation import stopping
    from harness.evaluation.hflm import harness_stop_sequences

    assert "stop_sequences_criteria" in lm_eval_hf.HFLM._model_generate.__code__.co_names
    assert lm_eval_hf.stop_sequences_criteria is lm_eval_criteria
    with harness_stop_sequences():
        assert lm_eval_hf.stop_sequences_criteria is stopping.stop_sequences_criteria
    assert lm_eval_hf.stop_sequences_criteria is lm_eval_criteria


def test_the_fast_eval_model_checks_stops_with_stop_sequences(tiny_model_dir, tokenizer, monkeypatch):
    from harness.evaluation import stopping
    from harness.evaluation.hflm import FastDecodeHFLM

    built = []
    original = stopping.stop_sequences_criteria

    def spy(*args):
        built.append(original(*args))
        return built[-1]

    monkeypatch.setattr("harness.evaluation.hflm.stop_sequences_criteria", spy)
    lm = FastDecodeHFLM(pretrained=str(tiny_model_dir), dtype="float32", add_bos_token=False, batch_size=2,
                        device="cpu")
    context = batch(tokenizer, ["", ""], prompt="Q: 12+7\nA:")
    lm._model_generate(context, context.shape[1] + 8, ["\nQ:"], do_sample=False)
    assert len(built) == 1 and isinstance(built[0][0], stopping.StopSequences)


def test_a_window_is_decoded_once(tokenizer):
    # rows that ended (here: the same padding from step 3 on) repeat their window: decoded once per generate call
    prompt_length = len(tokenizer.encode("Q: 1+2\nA:", add_special_tokens=False))
    sequences = batch(tokenizer, [" 3", " 3", " 12345678"])
    criteria = stop_sequences_criteria(tokenizer, ["\nQ:"], prompt_length, 3)
    theirs = decisions(lm_eval_criteria(tokenizer, ["\nQ:"], prompt_length, 3), sequences, prompt_length)
    assert decisions(criteria, sequences, prompt_length) == theirs
    (criterion,) = criteria
    steps = sequences.shape[1] - prompt_length
    assert criterion.checked_windows == 3 * steps
    assert criterion.decoded_windows < 2 * steps + 1  # rows 0 and 1 share every window
