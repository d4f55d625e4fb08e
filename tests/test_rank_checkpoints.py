"""A trainer checkpoint is marked complete only after every process has written its part (two processes, DDP over
gloo): the main process's weight write is slowed and, in the first run, killed half-way through the second save.
transformers has no barrier after its save, so before the fix the other process marked checkpoint-2 complete while
the weights were still being written, and the rerun resumed that torn folder. Also: the process group's collective
timeout is the configured one (the process group is created before TRL's config could set it)."""

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
import yaml

from harness.config.paths import SweepPaths

pytestmark = pytest.mark.slow

# imported at start-up by every worker process (PYTHONPATH first): rank 0's weight write sleeps, and exits at
# HOOK_KILL_AT_STEP as a time-limit kill would; every write of the completeness marker records what the folder holds
HOOK = textwrap.dedent("""
    import os
    if os.environ.get("RANK") is not None and os.environ.get("HOOK_LOG"):
        import json
        import time
        from pathlib import Path

        from transformers import Trainer

        import harness.train.budget as budget

        rank, log = int(os.environ["RANK"]), Path(os.environ["HOOK_LOG"])
        save, write = Trainer._save, budget.write_json_atomic

        def slow_save(self, output_dir=None, state_dict=None):
            if rank == 0:
                time.sleep(float(os.environ["HOOK_SLOW_S"]))
                if str(self.state.global_step) == os.environ.get("HOOK_KILL_AT_STEP"):
                    os._exit(1)
            return save(self, output_dir, state_dict)

        def recording_write(path, data, **kwargs):
            if Path(path).name == budget.LEDGER_FILE:
                with log.open("a") as out:
                    out.write(json.dumps({"rank": rank, "folder": Path(path).parent.name,
                                          "files": sorted(p.name for p in Path(path).parent.iterdir())}) + "\\n")
            return write(path, data, **kwargs)

        Trainer._save, budget.write_json_atomic = slow_save, recording_write
""")


def launch(root, settings, env_extra, timeout=600):
    import os
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sweep = root / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"name": "tiny", "preset": "tiny", "methods": ["uniform"], "seeds": [0]}))
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "-m", "harness.cli", "train",
               "--sweep", str(sweep), "--method", "uniform", "--seed", "0", *[f"--set={o}" for o in settings]]
    env = {**os.environ, **env_extra}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def test_a_save_killed_half_way_is_never_resumed(tiny_sweep, tmp_path):
    overrides, paths = tiny_sweep
    mine = SweepPaths(tmp_path / "tiny")
    shutil.copytree(paths.data_dir, mine.data_dir)
    shutil.copytree(paths.warmstart_dir.parent, mine.warmstart_dir.parent)
    hook_dir, log = tmp_path / "hook", tmp_path / "markers.jsonl"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    settings = [*overrides, f"results_dir={tmp_path}", "train.budget.amount=3", "train.save_every_steps=1",
                "train.budget.checkpoint_fractions=[1.0]", "train.collective_timeout_s=900"]
    import os

    pythonpath = os.pathsep.join([str(hook_dir), os.environ.get("PYTHONPATH", "")])
    killed = launch(tmp_path, settings, {"PYTHONPATH": pythonpath, "HOOK_LOG": str(log), "HOOK_SLOW_S": "3",
                                         "HOOK_KILL_AT_STEP": "2"})
    assert killed.returncode != 0, "the main process was to be killed in its second save"
    markers = [json.loads(line) for line in log.read_text().splitlines()]
    # one marker, checkpoint-1's, written once by the main process when the folder held the weights and every
    # process's RNG state (before the fix: each process wrote it, the other one before the weights existed)
    assert [(m["rank"], m["folder"]) for m in markers] == [(0, "checkpoint-1")]
    assert {"model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"} <= set(markers[0]["files"])
    trl_dir = mine.run_dir("uniform", 0) / "trl"
    assert (trl_dir / "checkpoint-2").is_dir() and not (trl_dir / "checkpoint-2" / "harness_budget.json").exists()

    resumed = launch(tmp_path, settings, {"PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    record = json.loads((mine.run_dir("uniform", 0) / "run.json").read_text())
    assert record["resumed_from"] == "checkpoint-1"
    assert record["budget"]["spent_steps"] == 3
    assert record["collective_timeout_s"] == 900  # read from the live process group
    # rotation kept the two newest complete checkpoints
    assert sorted(p.name for p in trl_dir.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
