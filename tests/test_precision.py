"""Mixed precision of the paper presets: bf16 compute over float32 master weights (train.master_dtype).

One optimizer step at paper-ktae's learning rate (1e-6), launched exactly as the preset launches its train job
(``harness.ops.resources.train_command``: accelerate launch with configs/accelerate/ddp.yaml, 2 processes here on
CPU, ``--mixed_precision bf16``), moves the weights as float32 training does (Adam's first step is about lr per
weight with a gradient), while pure bf16 weights (the presets before train.master_dtype) mostly do not move: an
update of 1e-6 is below half a bf16 ulp of any weight with |w| > ~2.6e-4.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from harness.config.loading import resolve
from harness.config.paths import SweepPaths
from harness.config.schema import ConfigError
from harness.ops.resources import train_command

REPO = Path(__file__).resolve().parent.parent
# scale only: everything that decides precision (launcher, distributed mode, model.dtype, master dtype, lr,
# optimizer) stays the preset's. The k1 KL term gives every weight a gradient even when all rewards are equal.
SCALE = ["prompt_template=tiny", "data.kind=synthetic", "train.reward=numeric", "train.prompts_per_step=2",
         "train.num_generations=4", "train.mini_batches=1", "train.max_completion_length=16",
         "train.overlong.buffer=0", "train.dynamic_sampling.enabled=false", "train.use_vllm=false",
         "train.budget.kind=steps", "train.budget.amount=1", "train.budget.checkpoint_fractions=[1.0]",
         "train.save_every_steps=1", "train.backward_chunk_rows=0", "resources.train.gpus=2", "train.beta=0.1",
         "train.kl_estimator=k1"]


def one_step(tiny_sweep, root: Path, extra: list[str]) -> tuple[float, dict]:
    """Mean |delta w| of one optimizer step of paper-ktae's launch path, and the run's recorded precision."""
    _, tiny = tiny_sweep
    mine = SweepPaths(root / "paper-ktae")
    shutil.copytree(tiny.data_dir, mine.data_dir)
    shutil.copytree(tiny.warmstart_dir.parent, mine.warmstart_dir.parent)
    sweep = root / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"name": "paper-ktae", "preset": "paper-ktae", "methods": ["uniform"],
                                     "seeds": [0]}))
    overrides = [f"results_dir={root}", *SCALE, *extra]
    preset = resolve(str(sweep), overrides).preset
    assert preset.train.learning_rate == 1e-6 and preset.train.launcher == "accelerate"
    args = f"train --sweep {sweep} --method uniform --seed 0 " + " ".join(f"--set={o}" for o in overrides)
    log = root / "train.log"
    command = train_command(preset, args, mine.warmstart_dir, log=str(log))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", command], env=env, cwd=REPO, timeout=600)
    assert done.returncode == 0, log.read_text()[-4000:]
    before = load_file(tiny.warmstart_dir / "model.safetensors")
    run_dir = mine.run_dir("uniform", 0)
    after = load_file(run_dir / "trl" / "checkpoint-1" / "model.safetensors")  # the master weights
    # the step's change, not the rounding of the float32 warm start to a bf16 master copy
    deltas = torch.cat([(after[k].float() - before[k].to(after[k].dtype).float()).abs().flatten() for k in before])
    record = json.loads((run_dir / "run.json").read_text())
    return float(deltas.mean()), record


@pytest.fixture(scope="module")
def three_launches(tiny_sweep, tmp_path_factory):
    return {name: one_step(tiny_sweep, tmp_path_factory.mktemp(name), extra) for name, extra in (
        ("preset", []),  # model.dtype bfloat16 (the preset's), master weights float32 (the default)
        ("float32", ["model.dtype=float32"]),
        ("pure_bf16", ["train.master_dtype=bfloat16"]))}


@pytest.mark.slow
def test_preset_launch_moves_weights_as_float32_training(three_launches):
    mixed, record = three_launches["preset"]
    reference, _ = three_launches["float32"]
    assert reference > 5e-7  # Adam's first step: about lr = 1e-6 on every weight with a gradient
    assert abs(mixed / reference - 1) < 0.10
    precision = record["precision"]
    assert precision["mixed_precision"] == "bf16" and precision["compute_dtype"] == "bfloat16"
    assert precision["trainable_dtypes"] == ["torch.float32"]
    assert precision["optimizer_state_dtypes"] == ["torch.float32"]
    assert record["budget"]["processes"] == 2
    # the budget checkpoint is written in the dtype it is evaluated in
    ckpt = Path(record["config"]["sweep"]["results_dir"]) / "paper-ktae" / "runs" / "uniform" / "seed0" / "ckpt-100"
    assert json.loads((ckpt / "config.json").read_text())["dtype"] == "bfloat16"


@pytest.mark.slow
def test_pure_bf16_weights_barely_move(three_launches):
    pure, record = three_launches["pure_bf16"]
    reference, _ = three_launches["float32"]
    assert pure / reference < 0.2  # measured 0.025: ~2% of the weights move at all
    assert record["precision"]["trainable_dtypes"] == ["torch.bfloat16"]


def test_pure_bf16_masters_need_a_bf16_model():
    with pytest.raises(ConfigError, match="train.master_dtype=bfloat16"):
        resolve({"name": "t", "preset": "tiny"}, ["train.master_dtype=bfloat16"])
