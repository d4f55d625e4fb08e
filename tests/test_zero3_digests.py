"""The weight digests of run.json (``harness verify`` replays against them) under DeepSpeed ZeRO-3: each process
holds an empty ``p.data`` per partitioned weight, so hashing it gave one constant digest for every run of a 7B/8B
preset. Two processes over gloo on CPU: the digest of the partitioned model equals the unsharded model's."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")


def test_weight_digests_under_zero3_are_the_whole_models(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = Path(__file__).with_name("zero3_digest_probe.py")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
                           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", str(script), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank-*.json"))]
    assert sorted(line["rank"] for line in lines) == [0, 1]
    for line in lines:
        assert line["data_numel"] == 0 and line["partition_numel"] < line["full_numel"]  # partitioned for real
        assert line["sharded"] == line["unsharded"]
