"""The committed example (results/example/, scripts/copy-example.sh): every number of its per-run table traces to the
generations it ships (samples.jsonl.gz beside each results.json), and its leaderboard opens with the bottom line."""

import csv
import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "results" / "example"


def runs() -> list[dict]:
    with (EXAMPLE / "leaderboard_runs.csv").open() as handle:
        return list(csv.DictReader(handle))


def per_problem(samples_file: Path, mode: str) -> dict[str, float]:
    correct = defaultdict(list)
    with gzip.open(samples_file, "rt", encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            if row["mode"] == mode:
                correct[row["id"]].append(float(row["correct"]))
    return {problem: sum(values) / len(values) for problem, values in correct.items()}


@pytest.mark.parametrize("row", runs(), ids=lambda r: f"{r['method']}-{r['seed']}-{r['ckpt']}-{r['bench']}")
def test_each_runs_accuracy_is_the_mean_of_the_generations_it_ships(row):
    results_file = EXAMPLE / row["results_file"]
    samples_file = results_file.with_name("samples.jsonl.gz")
    assert json.loads(results_file.read_text())["samples_file"] == "samples.jsonl"
    sampled, greedy = per_problem(samples_file, "sampled"), per_problem(samples_file, "greedy")
    assert len(sampled) == int(row["n_problems"])
    assert sum(sampled.values()) / len(sampled) == pytest.approx(float(row["avg@k"]), abs=1e-12)
    if row["greedy_accuracy"]:
        assert sum(greedy.values()) / len(greedy) == pytest.approx(float(row["greedy_accuracy"]), abs=1e-12)


def test_the_example_leaderboard_opens_with_the_bottom_line():
    md = (EXAMPLE / "leaderboard.md").read_text()
    assert md.splitlines()[2] == "## Bottom line"
    assert md.index("## Bottom line") < md.index("## Full budget") < md.index("## How to read these numbers")
