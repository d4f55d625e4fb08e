"""The analytic peak-memory model of ``harness plan`` (harness/config/memory.py) against the harness's own forward
+ backward run on fake tensors at a paper model's real dimensions.

The model is built inside ``torch._subclasses.fake_tensor.FakeTensorMode`` from the public dimensions in
``harness.config.memory.ARCHITECTURES`` (default Qwen/Qwen2.5-Math-1.5B: no hub download, no real memory), with
float32 master weights and AdamW state created before tracking (one step on zero gradients: the memory tracker
refuses a module called in a second tracked iteration). Then ``torch.distributed._tools.mem_tracker.MemTracker``
follows one step of the harness's packed forward: the model's attention switched to the harness's
``PACKED_ATTENTION`` and its LM head swapped for ``StatisticsHead`` (``stats_chunk_size`` 256), exactly as
``harness.train.token_statistics.packed_model_token_statistics`` runs them, under bf16 autocast (one autocast region
around forward and backward: its weight cache lives for the whole region), with activation checkpointing as
``train.activation_checkpointing`` sets it, then backward and the AdamW step. The index tensors of a packed chunk
(``harness.train.row_chunks.packed_rows``) are data-dependent, so the bench builds them with their shapes directly
(rows of equal length, no shared prompt). Attention: the harness calls SDPA with ``is_causal``; here its CPU flash
kernel is called directly (``aten._scaled_dot_product_flash_attention_for_cpu``), so that the fake run keeps the
O(L) footprint a GPU's flash kernel has instead of any L x L fallback (shared/ECOSYSTEM.md section 12 found fake
CUDA tensors take the math path).

Cases (rows x tokens per row): a backward chunk with checkpointing (what the paper presets run), one without, a
no-grad forward chunk (the statistics pass before chunked backward). Each prints the tracker's peak by category and
the analytic figure of the same parts (weights, gradients, AdamW, autocast cache, activations, head), and the
ratio measured / analytic. A CPU run: the fake tensors carry CPU kernels' shapes, which for these ops are the
GPU's (no cuBLAS workspaces, no allocator rounding, no CUDA context: those are outside the comparison).

Usage:  python -m bench.memory_model [--model Qwen/Qwen2.5-Math-1.5B] [--results DIR]   (~6 min on 2 cores)
"""

from __future__ import annotations

import argparse
import time

from bench.machine import environment
from bench.publish import add_path_args, publish, table

NAME = "memory_model"
GIB = 2**30
CASES = (  # (label, rows, tokens per row, with grad, activation checkpointing)
    ("backward chunk, checkpointing", 8, 3584, True, True),
    ("backward chunk, no checkpointing", 2, 1024, True, False),
    ("no-grad forward chunk", 16, 3584, False, True),
    ("small backward chunk (the end of backward peaks)", 1, 1024, True, True),
)
STATS_CHUNK = 256
COMPLETION_SHARE = 6 / 7  # completion tokens per row (3072 of 3584: prompt 512), the positions the head sees


def flash_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' sdpa_attention_forward signature over the CPU flash kernel (keys and values repeated to the
    query heads, as transformers does where SDPA's GQA path is off): (b, h, L, d) -> (b, L, h, d)."""
    import torch

    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, True, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def hf_config(arch):
    from transformers import Qwen2Config, Qwen3Config

    kwargs = dict(hidden_size=arch.hidden_size, intermediate_size=arch.intermediate_size,
                  num_hidden_layers=arch.num_hidden_layers, num_attention_heads=arch.num_attention_heads,
                  num_key_value_heads=arch.num_key_value_heads, vocab_size=arch.vocab_size,
                  tie_word_embeddings=arch.tie_word_embeddings, max_position_embeddings=arch.max_position_embeddings)
    if arch.qk_norm:
        return Qwen3Config(head_dim=arch.head_dim, **kwargs)
    return Qwen2Config(**kwargs)


def measure(arch, rows: int, tokens: int, grad: bool, checkpointing: bool) -> dict:
    """The tracker's peak (GiB by category) of one packed chunk through the harness's statistics head."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoModelForCausalLM

    import harness.train.token_statistics as ts

    ts.sdpa_attention_forward = flash_attention  # the packed attention's kernel (module docstring)
    n, m = rows * tokens, rows * int(tokens * COMPLETION_SHARE)
    with FakeTensorMode():
        model = AutoModelForCausalLM.from_config(hf_config(arch), dtype=torch.float32, attn_implementation="sdpa")
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        optimizer = None
        if grad:  # AdamW's state exists before the tracked step
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        input_ids = torch.randint(0, arch.vocab_size, (1, n))
        position_ids = torch.arange(tokens).repeat(rows)[None]
        layout = ts.PackedLayout(torch.arange(n).reshape(rows, tokens), torch.arange(n))
        predicting = torch.arange(m)  # the states that predict completion tokens (an index, as the harness's)
        targets = torch.randint(0, arch.vocab_size, (1, m))
        placeholder = torch.ones(1, 1, 1, 1, dtype=torch.bool)
        ts._enable_packed_attention(model)
        tracker = MemTracker()
        tracker.track_external(model, *([optimizer] if optimizer else []))
        with tracker, torch.autocast("cpu", dtype=torch.bfloat16), (torch.enable_grad() if grad else torch.no_grad()):
            head = ts.StatisticsHead(model.get_output_embeddings(), targets, (), 1.0, STATS_CHUNK, shifted=False)
            with ts._head_swapped(model, head):
                stats = model(input_ids=input_ids, attention_mask=placeholder, position_ids=position_ids,
                              logits_to_keep=predicting, use_cache=False, packed_layout=layout).logits
            if grad:
                stats[..., 0].sum().backward()
                optimizer.step()
        peak = tracker.get_tracker_snapshot("peak")
    by_category = {}
    for categories in peak.values():
        for key, value in categories.items():
            name = str(key).rpartition(".")[2]
            by_category[name] = by_category.get(name, 0) + value
    return {name: value / GIB for name, value in by_category.items()}


def analytic(arch, rows: int, tokens: int, grad: bool, checkpointing: bool) -> dict:
    """harness/config/memory.py's parts for the same single-process step (float32 masters, bf16 autocast)."""
    from harness.config.memory import embedding_gradient_bytes, grad_chunk_bytes, head_bytes, nograd_chunk_bytes

    n = arch.parameters
    parts = {"weights": 4 * n, "autocast weight cache": 2 * arch.autocast_parameters}
    head = head_bytes(arch, STATS_CHUNK, 2)
    if grad:
        parts.update({"gradients": 4 * n, "AdamW state": 8 * n})
        chunk = grad_chunk_bytes(arch, rows * tokens, 4, 2, checkpointing) + head
        parts["activations"] = max(chunk, embedding_gradient_bytes(arch, 4))  # as training_memory takes it
    else:
        parts["activations"] = nograd_chunk_bytes(arch, rows * tokens, 4, 2) + head
    return {name: value / GIB for name, value in parts.items()}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen2.5-Math-1.5B", help="a hub id of ARCHITECTURES")
    add_path_args(parser, workdir=False)
    args = parser.parse_args(argv)

    from harness.config.memory import ARCHITECTURES

    arch = ARCHITECTURES[args.model]
    results, rows = [], []
    for label, n_rows, tokens, grad, checkpointing in CASES:
        started = time.perf_counter()
        measured = measure(arch, n_rows, tokens, grad, checkpointing)
        model = analytic(arch, n_rows, tokens, grad, checkpointing)
        seconds = time.perf_counter() - started
        measured_other = measured["Total"] - measured.get("PARAM", 0) - measured.get("OPT", 0) - measured.get("GRAD", 0)
        model_other = model["activations"] + model["autocast weight cache"]
        record = {"case": label, "rows": n_rows, "tokens_per_row": tokens, "grad": grad,
                  "checkpointing": checkpointing, "measured_gib": measured, "analytic_gib": model,
                  "measured_peak_gib": measured["Total"], "analytic_peak_gib": sum(model.values()),
                  "measured_activations_gib": measured_other, "analytic_activations_gib": model_other,
                  "seconds": seconds}
        record["peak_ratio"] = record["measured_peak_gib"] / record["analytic_peak_gib"]
        record["activation_ratio"] = measured_other / model_other
        results.append(record)
        rows.append([label, f"{n_rows} x {tokens}", f"{record['measured_peak_gib']:.2f}",
                     f"{record['analytic_peak_gib']:.2f}", f"{record['peak_ratio']:.2f}", f"{measured_other:.2f}",
                     f"{model_other:.2f}", f"{record['activation_ratio']:.2f}"])
        print(f"{label}: measured {measured}, analytic {model}, {seconds:.0f} s", flush=True)
    env = environment(args.cpu_free_flag)
    markdown = "\n".join([
        f"## Peak memory model: fake-tensor measurement against the analytic figure ({args.model})", "",
        f"`python -m bench.memory_model` ({env.get('date', '')}): the harness's packed forward with the statistics "
        "head on fake tensors at the model's real dimensions, float32 masters, bf16 autocast, one process; "
        "MemTracker's peak against harness/config/memory.py's parts of the same step. \"Activations\" = the peak "
        "less weights, gradients and AdamW state (measured: ACT + TEMP + the autocast cache; analytic: the chunk, "
        "the head and the cache, or the end of backward's embedding gradient when larger).", "",
        table(["case", "rows x tokens", "measured peak GiB", "analytic GiB", "ratio", "measured activations GiB",
               "analytic activations GiB", "ratio"], rows)])
    return publish(args.results, NAME, {"name": NAME, "model": args.model, "cases": results, "environment": env},
                   markdown)


if __name__ == "__main__":
    main()
