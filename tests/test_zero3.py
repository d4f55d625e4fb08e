"""Rank-dependent token and row counts through the token statistics, on 2 processes over gloo (issue 33, item 2 and
section C): every process runs the same number of module calls per pass (ZeRO-3 gathers a module's weights on each
call, so unequal counts pair up the wrong collectives: an abort or a hang), and under DeepSpeed ZeRO-3 for real the
passes complete with the logp and gradients of an unsharded model. The processes are
``tests/zero3_statistics_probe.py``: process 0 has 3 rows of 6 completion tokens, process 1 5 rows of 10 (2 row
chunks against 3, and 5 LM-head chunks of 4 positions against 13)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parent / "zero3_statistics_probe.py"
PROBE_TIMEOUT_S = 240  # ~25 s each; a process left waiting in a collective fails at gloo's 60 s timeout or here
PASSES = ("nograd_calls", "grad_calls", "chunked_calls")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_probe(out: Path, mode: str) -> list[dict]:
    """The probe in ``mode`` on 2 processes; each process's record."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(PROBE), str(out), mode]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    try:
        output, _ = launcher.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        output, _ = launcher.communicate()
        pytest.fail(f"{mode}: a process still waiting after {PROBE_TIMEOUT_S} s\n{output[-3000:]}")
    assert launcher.returncode == 0, output[-4000:]
    return [json.loads((out / f"process-{p}.json").read_text()) for p in (0, 1)]


def test_every_process_calls_the_lm_head_and_each_layer_as_often(tmp_path):
    first, second = run_probe(tmp_path, "calls")
    for name in PASSES:
        assert first[name] == second[name], name
    # one LM-head call per model forward, its chunks inside it (calling the head per chunk of 4 positions, and
    # again per chunk in backward, made that 5 calls against 13 in the no-grad pass and 10 against 26 with grad);
    # 3 forwards, for process 1's 3 row chunks; in backward row chunks a no-grad pass, then a forward + backward
    # per chunk
    assert first["nograd_calls"] == {"head": 3, "layer": 3}
    assert first["grad_calls"] == {"head": 3, "layer": 3, "backward": 1}
    assert first["chunked_calls"] == {"head": 6, "layer": 6, "backward": 3}
    # the check fails where each process runs only its own row chunks (2 against 3): the counts differ
    without = [first["without_idle"], second["without_idle"]]
    assert [w["nograd_calls"]["layer"] for w in without] == [2, 3]
    assert [w["chunked_calls"]["backward"] for w in without] == [2, 3]
    # the idle forwards change no statistic: process 0's logp are the same with and without them
    assert first["grad_logp"] == first["without_idle"]["grad_logp"]
    assert first["nograd_logp"] == first["without_idle"]["nograd_logp"]


def test_zero3_statistics_with_rank_dependent_token_counts_match_one_process(tmp_path):
    pytest.importorskip("deepspeed")
    first, second = run_probe(tmp_path, "zero3")
    for record in (first, second):
        assert record["partitioned"]  # the LM head's weight is sharded between uses
        assert record["nograd_logp"] == record["reference_logp"]
        assert record["grad_logp"] == record["reference_logp"]
        assert max(record["gradients"].values()) < 1e-6  # ZeRO's averaged full gradients against one process's
        assert record["chunked_calls"] == {"head": 6, "layer": 6, "backward": 3}
    assert first["grad_calls"] == second["grad_calls"]


def test_ddp_row_chunked_backward_all_reduces_once(tmp_path):
    """Item 10: under DDP the backward row chunks accumulate without synchronising and all-reduce once, in the last
    chunk's backward, as many bucket all-reduces as one backward of the whole batch (each chunk's forward ran outside
    no_sync, and DDP, which decides in the forward, all-reduced in every chunk's backward: 3x here)."""
    first, second = run_probe(tmp_path, "ddp")
    for record in (first, second):
        assert record["allreduces"]["one_backward"] >= 1
        assert record["allreduces"]["chunked"] == record["allreduces"]["one_backward"]
    assert first["chunked_calls"] == second["chunked_calls"]
