"""Greedy and sampled decoding that reproduces transformers' ``generate`` token for token, with less Python per step.

``generate`` (transformers 5.24) prepares a call (the generation config merged with the model's, logits processors,
stopping criteria, the attention mask from padding, position ids, an empty KV cache) and then runs
``GenerationMixin._sample``. ``generate`` here passes ``sample`` as generate's own ``custom_generate`` callable, so
all of that preparation stays transformers'; ``sample`` replaces only the loop. A step of ``_sample`` rebuilds the
model inputs (``prepare_inputs_for_generation``, ``_update_model_kwargs_for_generation``) and runs the model's whole
forward, which rebuilds the attention mask and wraps its outputs; on the tiny preset's 0.45M-parameter model that
bookkeeping is a sizeable share of a step (bench/rollout_throughput.py measures it). ``sample`` computes the same
things in the same order: the prefill exactly as ``generate`` runs it, then per step the same forward (for a plain
``LlamaForCausalLM`` its decoder layers called directly, with the mask ``create_causal_mask`` would build: none
without padding, the padding mask otherwise), the logits' float32 copy, the same logits processors, softmax and
``torch.multinomial`` (or argmax), finished rows padded, and the stopping criteria called as ``generate`` calls
them. Tokens, logits and the RNG state afterwards are identical (tests/test_decode.py).

Which loop runs is decided from the call and the prepared configuration, never by catching an error:

- ``generate`` calls plain ``model.generate`` when the call has an assistant model, a streamer, a tokenizer (stop
  strings), ``synced_gpus`` or its own ``custom_generate``, or when generation is sharded over processes
  (DeepSpeed ZeRO-3 / FSDP): generate does not hand those to a custom loop.
- ``sample`` refuses (ValueError) any mode but greedy and sampling (beam search, assisted decoding): the harness
  asks for neither.
- ``sample`` runs transformers' own ``_sample`` with the same arguments (the result ``generate`` gives) for
  ``return_dict_in_generate`` (scores, logits, ...), a cache other than a fresh plain ``DynamicCache`` (static,
  sliding-window, quantized, offloaded), no cache, chunked prefill, model inputs besides the attention mask and
  position ids (images, ``inputs_embeds``, token types), an encoder-decoder model, or a model class with its own
  ``prepare_inputs_for_generation`` / ``_update_model_kwargs_for_generation``.
- Otherwise ``sample`` decodes; the decoder-layer step is used for ``LlamaForCausalLM`` itself (not a subclass)
  whose attention implementation takes SDPA's mask (``sdpa``, or one registered with ``sdpa_mask``), causal, its
  ``forward`` not replaced on the instance (accelerate's mixed-precision wrapper) and no forward hooks on it or its
  ``model``; other models get their full forward each step.
"""

from __future__ import annotations

import inspect
import logging
from contextlib import contextmanager

import torch
from transformers import GenerationMixin, LlamaForCausalLM
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.distributed.fsdp import is_fsdp_managed_module
from transformers.distributed.utils import _get_torch_distributed_world_size
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

logger = logging.getLogger(__name__)

# generate() drops these from a custom_generate call (or needs synced steps): such calls stay on plain generate
PLAIN_GENERATE_ARGUMENTS = ("assistant_model", "streamer", "tokenizer", "assistant_tokenizer", "synced_gpus",
                            "custom_generate")
MODEL_INPUTS = frozenset({"attention_mask", "position_ids", "cache", "use_cache", "logits_to_keep"})


def generate(model, **kwargs) -> torch.LongTensor:
    """``model.generate(**kwargs)``: the same sequences (prompt included), decoded by ``sample`` where it applies
    (module docstring)."""
    plain = type(model).generate  # the class's: ``generating_with_sample`` puts this function on the instance
    # generate's own synced_gpus rule: sharded weights need every process to run every step
    sharded = ((is_deepspeed_zero3_enabled() or is_fsdp_managed_module(model))
               and _get_torch_distributed_world_size() > 1)
    if sharded or any(kwargs.get(name) is not None for name in PLAIN_GENERATE_ARGUMENTS):
        return plain(model, **kwargs)
    return plain(model, **kwargs, custom_generate=sample)


@contextmanager
def generating_with_sample(model):
    """While active, ``model.generate`` is ``generate`` above: for callers that own the ``generate`` call (TRL's
    rollouts, lm-eval's HFLM)."""
    if "generate" in vars(model):
        raise RuntimeError(f"{type(model).__name__}.generate is already replaced on this instance")
    model.generate = lambda **kwargs: generate(model, **kwargs)
    try:
        yield model
    finally:
        del model.generate


def fallback_reason(model, generation_config, model_kwargs: dict) -> str | None:
    """Why ``sample`` hands a call to transformers' ``_sample`` (None: it decodes it itself)."""
    cache = model_kwargs.get("cache")
    extra = sorted(k for k, v in model_kwargs.items() if v is not None and k not in MODEL_INPUTS)
    position_ids = model_kwargs.get("position_ids")
    if generation_config.return_dict_in_generate:
        return "return_dict_in_generate (scores, logits, attentions or hidden states asked for)"
    if generation_config.prefill_chunk_size is not None or generation_config.is_assistant:
        return "chunked prefill or an assistant model's generation"
    if model.config.is_encoder_decoder:
        return "an encoder-decoder model"
    if extra:
        return f"model inputs {extra}"
    if not model_kwargs.get("use_cache") or type(cache) is not DynamicCache or not cache.layers \
            or any(type(layer) is not DynamicLayer for layer in cache.layers) or cache.get_seq_length() > 0:
        return f"a cache other than a fresh full-attention DynamicCache ({type(cache).__name__})"
    if position_ids is None or position_ids.ndim != 2:
        return "no 2-D position ids"
    if (type(model).prepare_inputs_for_generation is not GenerationMixin.prepare_inputs_for_generation
            or type(model)._update_model_kwargs_for_generation
            is not GenerationMixin._update_model_kwargs_for_generation):
        return f"{type(model).__name__} prepares its own generation inputs"
    if generation_config.max_length is None:
        return "no max_length"
    return None


def decoder_layer_step_applies(model) -> bool:
    """The decode step may call a ``LlamaForCausalLM``'s layers directly: nothing the skipped forward wrappers do
    (mask creation, output capture, a replaced forward, hooks) changes a step's result (module docstring)."""
    from torch.nn.modules import module as torch_module

    config = model.config
    # the mask the skipped create_causal_mask would build is sdpa_mask's (also under an attention implementation
    # registered with it, such as the harness's packed attention, which is sdpa for these calls)
    return (type(model) is LlamaForCausalLM
            and ALL_MASK_ATTENTION_FUNCTIONS.get(config._attn_implementation) is sdpa_mask
            and getattr(config, "is_causal", True) and not config.output_attentions
            and not config.output_hidden_states
            and not any("forward" in vars(m) or m._forward_hooks or m._forward_pre_hooks
                        for m in (model, model.model))
            and not (torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks))


def sample(model, input_ids: torch.LongTensor, logits_processor, stopping_criteria, generation_config,
           **model_kwargs) -> torch.LongTensor:
    """``GenerationMixin._sample`` for greedy and sampled decoding without return_dict_in_generate: the sequences,
    prompt included. Called by ``generate`` (transformers' custom_generate interface) with what it prepared."""
    mode = generation_config.get_generation_mode()
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
        raise ValueError(f"harness.model.decode.sample decodes greedy or sampled generation only, not {mode.value} "
                         "(set train.fast_decode / eval.fast_decode to false to use transformers' generate)")
    reason = fallback_reason(model, generation_config, model_kwargs)
    if reason is not None:
        logger.info("harness.model.decode: transformers' own decoding loop for %s", reason)
        return type(model)._sample(model, input_ids, logits_processor=logits_processor,
                                   stopping_criteria=stopping_criteria, generation_config=generation_config,
                                   **model_kwargs)
    pad_token_id = generation_config._pad_token_tensor
    if pad_token_id is not None:
        pad_token_id = pad_token_id.to(input_ids.device)
    has_eos_stopping_criteria = any(hasattr(criteria, "eos_token_id") for criteria in stopping_criteria)
    unfinished_sequences = torch.ones(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
    cache, attention_mask = model_kwargs["cache"], model_kwargs.get("attention_mask")
    process = _processors(logits_processor)
    stopped = _stopping(stopping_criteria, input_ids.device)
    step = _layers_step(model) if decoder_layer_step_applies(model) else _forward_step(model, model_kwargs)

    # the prefill as generate runs it (_prefill: prepare_inputs_for_generation on the whole prompt)
    outputs = model(**model.prepare_inputs_for_generation(input_ids, is_first_iteration=True, **model_kwargs),
                    return_dict=True)
    logits = outputs.logits
    del outputs
    position_ids = model_kwargs["position_ids"][:, -1:]
    with model._optimize_model_for_decode():
        while True:
            # as _sample: a float32 copy of the last position's logits, the processors, then the token
            next_token_logits = logits[:, -1].to(copy=True, dtype=torch.float32, device=input_ids.device)
            del logits
            next_token_scores = process(input_ids, next_token_logits)
            if generation_config.do_sample:
                probs = torch.nn.functional.softmax(next_token_scores, dim=-1)
                next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
            else:
                next_tokens = torch.argmax(next_token_scores, dim=-1)
            if has_eos_stopping_criteria:  # finished rows get the pad token
                next_tokens = next_tokens * unfinished_sequences + pad_token_id * (1 - unfinished_sequences)
            input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
            done, at_max_length = stopped(input_ids, next_tokens)
            unfinished_sequences = unfinished_sequences & ~done
            if at_max_length or unfinished_sequences.max() == 0:
                break
            # the next forward's inputs as _update_model_kwargs_for_generation + prepare_inputs_for_generation make
            # them: the new token, its position (last + 1), the mask grown by a column of ones
            position_ids = position_ids + 1
            if attention_mask is not None:
                attention_mask = torch.cat([attention_mask, attention_mask.new_ones((attention_mask.shape[0], 1))],
                                           dim=-1)
            logits = step(next_tokens[:, None], position_ids, cache, attention_mask)
    return input_ids


def _processors(logits_processor):
    """LogitsProcessorList.__call__ without its per-step signature inspection: processors taking (input_ids,
    scores) called in order; a list with any other processor is called as it is."""
    processors = list(logits_processor)
    if any(len(inspect.signature(p.__call__).parameters) > 2 for p in processors):
        return logits_processor

    def process(input_ids, scores):
        for processor in processors:
            scores = processor(input_ids, scores)
        return scores

    return process


def _stopping(stopping_criteria, device):
    """StoppingCriteriaList.__call__ as (rows done, max length reached): transformers' EOS criteria as one isin
    over the new tokens (each checks the last token), its max-length criterion as a length test (it marks every row
    done; its log line past max_position_embeddings is not repeated), every other criterion called as generate
    calls it, each step, results or-ed (lm-eval's stop sequences keep their per-row state)."""
    eos = [c.eos_token_id.reshape(-1) for c in stopping_criteria if type(c) is EosTokenCriteria]
    eos_ids = torch.cat(eos).to(device) if eos else None
    max_lengths = [c.max_length for c in stopping_criteria if type(c) is MaxLengthCriteria]
    max_length = min(max_lengths) if max_lengths else None
    others = [c for c in stopping_criteria if type(c) not in (EosTokenCriteria, MaxLengthCriteria)]

    def stopped(input_ids, next_tokens):
        done = (torch.isin(next_tokens, eos_ids) if eos_ids is not None
                else torch.zeros(next_tokens.shape, dtype=torch.bool, device=device))
        for criteria in others:
            done = done | criteria(input_ids, None)
        return done, max_length is not None and input_ids.shape[1] >= max_length

    return stopped


def _forward_step(model, model_kwargs: dict):
    """One new token per row through the model's forward, with the inputs generate would pass."""
    step_kwargs = {k: model_kwargs[k] for k in ("use_cache", "logits_to_keep") if k in model_kwargs}

    def step(tokens, position_ids, cache, attention_mask):
        mask = {} if attention_mask is None else {"attention_mask": attention_mask}
        return model(input_ids=tokens, cache=cache, position_ids=position_ids, **mask, **step_kwargs,
                     return_dict=True).logits

    return step


def _layers_step(model: LlamaForCausalLM):
    """LlamaForCausalLM.forward for one new token per row (LlamaModel.forward's body, logits of that token),
    without its wrappers. The 4-D mask is what ``create_causal_mask`` builds for SDPA with a one-token query:
    none without padding, else each row's padding mask (every cached position precedes the query)."""
    inner = model.model
    embed, rotary, norm, lm_head = inner.embed_tokens, inner.rotary_emb, inner.norm, model.lm_head
    layers = list(inner.layers[: model.config.num_hidden_layers])

    def step(tokens, position_ids, cache, attention_mask):
        mask = None if attention_mask is None else attention_mask.to(dtype=torch.bool)[:, None, None, :]
        hidden = embed(tokens)
        position_embeddings = rotary(hidden, position_ids=position_ids)
        for layer in layers:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings,
                           position_ids=position_ids, cache=cache, use_cache=True)
        return lm_head(norm(hidden))

    return step
