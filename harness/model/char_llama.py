"""The char-level Llama of the tiny preset: a one-token-per-character tokenizer, the model, and its supervised warm
start on worked solutions (written as a plain Hugging Face directory by ``harness.model.checkpoints.save_policy``).
"""

from __future__ import annotations

import math
import string
import time
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from harness.config.schema import ModelConfig, WarmstartConfig
from harness.model.checkpoints import save_policy

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>"]


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable ASCII character (plus newline and tab), four special tokens."""
    chars = sorted(set(string.printable) - set("\r\x0b\x0c"))
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join without spaces
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   unk_token="<unk>", clean_up_tokenization_spaces=False, padding_side="left")


def build_char_llama(cfg: ModelConfig, tokenizer: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def sft_batches(rows: list[dict], tokenizer, prompt_fn, batch_size: int, generator: torch.Generator):
    """Endless (input_ids, attention_mask, labels) batches; the loss covers the solution and EOS only."""
    encoded = []
    for row in rows:
        prompt = tokenizer(prompt_fn(row["problem"]), add_special_tokens=False)["input_ids"]
        target = tokenizer(row["solution"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        encoded.append((prompt, target))
    while True:
        order = torch.randperm(len(encoded), generator=generator).tolist()
        for start in range(0, len(order) - batch_size + 1, batch_size):
            chunk = [encoded[i] for i in order[start:start + batch_size]]
            width = max(len(p) + len(t) for p, t in chunk)
            ids = torch.full((batch_size, width), tokenizer.pad_token_id)
            labels = torch.full((batch_size, width), -100)
            mask = torch.zeros((batch_size, width), dtype=torch.long)
            for row, (p, t) in enumerate(chunk):  # right padding for teacher forcing
                seq = p + t
                ids[row, :len(seq)] = torch.tensor(seq)
                labels[row, len(p):len(seq)] = torch.tensor(t)
                mask[row, :len(seq)] = 1
            yield ids, mask, labels


def warmstart_char_llama(model_cfg: ModelConfig, cfg: WarmstartConfig, rows: list[dict], prompt_fn,
                         out_dir: Path) -> dict:
    """Supervised training on worked solutions; writes a model directory and returns a summary."""
    tokenizer = build_char_tokenizer()
    model = build_char_llama(model_cfg, tokenizer, seed=cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=0.01)
    warmup = max(1, cfg.steps // 20)

    def lr_factor(step: int) -> float:  # linear warm-up, cosine decay to 10%
        return min(1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / max(1, cfg.steps))))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    batches = sft_batches(rows, tokenizer, prompt_fn, cfg.batch_size, generator)
    losses, start = [], time.perf_counter()
    model.train()
    for _ in range(cfg.steps):
        ids, mask, labels = next(batches)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    save_policy(model, tokenizer, out_dir)
    n_params = sum(p.numel() for p in model.parameters())
    return {"steps": cfg.steps, "seconds": time.perf_counter() - start, "parameters": n_params,
            "final_loss": sum(losses[-50:]) / max(1, len(losses[-50:])), "loss_every_50": losses[::50]}
