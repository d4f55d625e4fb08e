"""The data job's training data overlap with the benchmarks (harness/data/decontamination.py): open-r1's word 8-grams
on hand-computed rows, the short-problem rule, the report it writes, the refusal over data.max_ngram_overlap that names
the key, the training data and the benchmark, and how the report and the fidelity table show it."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config.loading import resolve
from harness.config.paths import CONFIG_DIR, SweepPaths
from harness.config.schema import ConfigError
from harness.config.snapshot import data_config, digest, training_config, warmstart_config
from harness.data.decontamination import (
    DecontaminationError,
    normalize,
    overlap_report,
    read_report,
    summary,
    word_ngrams,
)
from harness.data.files import sha256_file
from harness.data.prepare import prepare_data
from harness.report.fidelity import load_fidelity
from harness.report.markdown import overlap_lines

NINE = "one two three four five six seven eight nine"  # 9 words: two 8-grams


def rows(*problems: str, prefix: str = "t") -> list[dict]:
    return [{"id": f"{prefix}{i}", "problem": p} for i, p in enumerate(problems)]


def test_normalisation_is_open_r1s_lowercase_and_whitespace_only():
    assert normalize("  Express\tYOUR answer\n\n as a  Fraction. ") == "express your answer as a fraction."
    assert normalize("$\\frac{m}{n}$,  where") == "$\\frac{m}{n}$, where"  # punctuation stays in its word


def test_word_ngrams_of_eight_nine_and_seven_words():
    assert word_ngrams(" ".join(NINE.split()[:8])) == {"one two three four five six seven eight"}
    assert word_ngrams(NINE.upper()) == {"one two three four five six seven eight",
                                         "two three four five six seven eight nine"}
    assert word_ngrams("one two three four five six seven") == set()  # open-r1: no n-gram under 8 words


def test_rows_flagged_by_a_shared_8gram_or_a_whole_short_problem():
    benchmarks = {"bench": {"file": "b.jsonl", "rows": rows(NINE, "Compute 2+2.", prefix="b")},
                  "other": {"rows": rows("nothing in common with any training row at all here", prefix="o")}}
    train = rows("ONE two  three four five six seven eight",  # the first 8-gram of b0: half of its 8-grams
                 "zero one two three four five six seven",  # shifted: no 8-gram in common
                 "Please compute 2+2. now",  # holds the short problem b1 whole, in order
                 "compute 2+2",  # without the full stop: another word, not flagged
                 "2+2. compute",  # the words of b1, not in order
                 "one two three four five")  # under 8 words: no 8-gram, cannot share one
    report = overlap_report(train, benchmarks)
    assert report["train_rows"] == 6 and report["ngram"] == 8
    bench = report["benchmarks"]["bench"]
    assert bench["file"] == "b.jsonl" and "rows" not in bench
    assert (bench["problems"], bench["short_problems"]) == (2, 1)
    assert (bench["rows_flagged"], bench["rows_flagged_short"], bench["fraction"]) == (2, 1, 2 / 6)
    assert bench["example_rows"] == ["t0", "t2"]
    assert bench["shared_ngrams"] == [["compute 2+2.", 1], ["one two three four five six seven eight", 1]]
    assert (bench["problems_hit"], bench["near_duplicates"]) == (2, 2)  # b0 at share 0.5, b1 whole
    assert bench["near_duplicate_examples"] == [{"problem": "b1", "row": "t2", "share": 1.0},
                                                {"problem": "b0", "row": "t0", "share": 0.5}]
    other = report["benchmarks"]["other"]
    assert (other["rows_flagged"], other["fraction"], other["problems_hit"], other["example_rows"]) == (0, 0.0, 0, [])


def test_a_row_below_half_of_a_problems_8grams_is_a_hit_not_a_near_duplicate():
    long_problem = " ".join(f"w{i}" for i in range(20))  # 13 distinct 8-grams
    report = overlap_report(rows("x " + " ".join(f"w{i}" for i in range(9)) + " y"),  # 2 of them
                            {"b": {"rows": rows(long_problem)}})["benchmarks"]["b"]
    assert (report["rows_flagged"], report["problems_hit"], report["near_duplicates"]) == (1, 1, 0)


@settings(max_examples=40, deadline=None)
@given(problem=st.lists(st.sampled_from(["a", "b", "c", "x+y", "$n$,"]), min_size=1, max_size=12),
       before=st.lists(st.sampled_from(["p", "q", "r"]), max_size=4),
       after=st.lists(st.sampled_from(["p", "q", "r"]), max_size=4))
def test_a_row_that_holds_a_problem_in_other_case_and_spacing_is_always_flagged(problem, before, after):
    row = "  ".join(before + [w.upper() for w in problem] + after)
    bench = overlap_report(rows(row), {"b": {"rows": rows(" ".join(problem))}})["benchmarks"]["b"]
    assert bench["rows_flagged"] == 1 and bench["near_duplicates"] == 1


def write_jsonl(path: Path, problems: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": f"{path.stem}-{i}", "problem": p, "answer": "1"}) + "\n"
                            for i, p in enumerate(problems)))
    return path


def mixed_sweep(tmp_path: Path, **data) -> dict:
    """The tiny preset with a few synthetic rows plus a training file and a benchmark file of our own (one of the
    training file's 4 rows shares an 8-gram with the benchmark)."""
    train = write_jsonl(tmp_path / "mine_train.jsonl", [f"Find x when x plus {NINE}.", "What is 1+1?",
                                                        "Unrelated words only here", "A b c"])
    (tmp_path / "SHA256SUMS").write_text(f"{sha256_file(train)}  {train.name}\n")
    bench = write_jsonl(tmp_path / "mine_bench.jsonl", [f"{NINE} ten.", "2+3"])
    synthetic = {"n_train": 16, "n_eval": 4, "n_ood": 4}
    return {"name": "decon", "preset": "tiny", "methods": ["uniform"], "seeds": [0],
            "results_dir": str(tmp_path / "results"),
            "data": {"kind": "mixed", "train_file": str(train), "synthetic": synthetic, **data},
            "eval": {"benchmarks": {"mine": {"file": str(bench), "scorer": "numeric"}}}}


def test_the_data_job_refuses_overlap_over_the_limit_naming_key_file_and_benchmark(tmp_path):
    resolved = resolve(mixed_sweep(tmp_path))
    paths = SweepPaths(resolved.results_dir)
    with pytest.raises(DecontaminationError) as refused:
        prepare_data(resolved, paths)
    message = str(refused.value)
    assert "key 'data.max_ngram_overlap' = 0:" in message
    assert f"{tmp_path / 'mine_train.jsonl'} (key 'data.train_file')" in message
    bench = tmp_path / "mine_bench.jsonl"
    assert f"1 of the 20 rows (5.00%) share a word 8-gram with benchmark 'mine' ({bench}; 1 of its 2" in message
    assert "e.g. rows ['mine_train-0']" in message and "at least 0.05 with data.overlap_reason" in message
    assert str(paths.data_dir / "decontamination.json") in message
    report = read_report(paths.data_dir)  # written before the refusal, to be read
    assert report["benchmarks"]["mine"]["rows_flagged"] == 1 and report["train_rows"] == 20
    assert not (paths.data_dir / "train.jsonl").exists()  # nothing left to train on
    # the synthetic benchmarks share nothing with the rows: one-word problems, none in the training rows
    assert [report["benchmarks"][b]["rows_flagged"] for b in ("arith", "arith_ood")] == [0, 0]


def test_a_stated_limit_and_reason_let_the_data_through_and_are_recorded(tmp_path):
    resolved = resolve(mixed_sweep(tmp_path, max_ngram_overlap=0.05, overlap_reason="measured: 1 of 20, on purpose"))
    paths = SweepPaths(resolved.results_dir)
    written = prepare_data(resolved, paths)
    assert written["decontamination"] == str(paths.data_dir / "decontamination.json")
    report = read_report(paths.data_dir)
    assert report["limit"] == {"data.max_ngram_overlap": 0.05, "data.overlap_reason": "measured: 1 of 20, on purpose"}
    assert report["train"] == {"file": "train.jsonl", "sha256": sha256_file(paths.data_dir / "train.jsonl"),
                               "source": f"synthetic (data.synthetic) + {tmp_path / 'mine_train.jsonl'} "
                                         "(key 'data.train_file')"}
    mine = report["benchmarks"]["mine"]
    assert (mine["file"], mine["sha256"]) == (str(tmp_path / "mine_bench.jsonl"),
                                              sha256_file(tmp_path / "mine_bench.jsonl"))
    assert (mine["problems"], mine["short_problems"], mine["fraction"]) == (2, 1, 1 / 20)
    assert "decontamination.json" not in (paths.data_dir / "SHA256SUMS").read_text()  # nothing trains from it


def test_a_generated_benchmark_that_is_not_there_is_listed_as_not_measured(tmp_path):
    sweep = mixed_sweep(tmp_path, kind="jsonl", max_ngram_overlap=0.25, overlap_reason="measured: 1 of 4")
    resolved = resolve(sweep)  # the tiny preset's arith splits are generated only with synthetic data
    paths = SweepPaths(resolved.results_dir)
    prepare_data(resolved, paths)
    report = read_report(paths.data_dir)
    assert report["unmeasured"] == {name: {"file": f"{{data_dir}}/{split}.jsonl",
                                           "reason": "no such file when the data job ran"}
                                    for name, split in (("arith", "eval"), ("arith_ood", "ood"))}
    assert list(report["benchmarks"]) == ["mine"] and report["benchmarks"]["mine"]["fraction"] == 1 / 4
    assert summary(report).endswith("mine 1/4 rows (25.00%), arith not measured (no such file when the data job "
                                    "ran), arith_ood not measured (no such file when the data job ran)")
    assert "| arith | not measured: {data_dir}/eval.jsonl: no such file when the data job ran | - |" in \
        "\n".join(overlap_lines(report))


def test_a_limit_above_zero_needs_a_reason():
    with pytest.raises(ConfigError, match=r"key 'data.overlap_reason' is empty, but data.max_ngram_overlap=0.1 "):
        resolve(CONFIG_DIR / "sweeps" / "default.yaml", ["data.max_ngram_overlap=0.1"])
    with pytest.raises(ConfigError, match=r"data.max_ngram_overlap.*outside the allowed range"):
        resolve(CONFIG_DIR / "sweeps" / "default.yaml", ["data.max_ngram_overlap=1.5", "data.overlap_reason=x"])


def test_the_limit_and_reason_rerun_nothing():
    """They decide whether the data job refuses, not what any job writes: left out of every job digest."""
    base = resolve(CONFIG_DIR / "sweeps" / "default.yaml")
    other = resolve(CONFIG_DIR / "sweeps" / "default.yaml", ["data.max_ngram_overlap=0.5", "data.overlap_reason=x"])
    for part in (data_config, training_config, warmstart_config):
        assert digest(part(base)) == digest(part(other)), part.__name__


def test_the_report_and_the_fidelity_table_show_it_or_say_not_measured(tmp_path):
    text = "\n".join(overlap_lines(None))
    assert "## Training data overlap with the benchmarks" in text and "Not measured" in text and "|" not in text
    assert summary(None).startswith("not measured")

    sweep = CONFIG_DIR / "sweeps" / "paper-rsi.yaml"
    resolved = resolve(sweep, [f"results_dir={tmp_path}"])
    data_row = next(r for r in load_fidelity(CONFIG_DIR / "fidelity" / "paper-rsi.yaml", resolved).rows
                    if r.element == "data")
    assert "derived.ngram_overlap=not measured" in data_row.ours and data_row.status == "unknown"  # as before

    report = {"train": {"file": "train.jsonl", "source": "data/train/math_train.jsonl", "sha256": "0" * 64},
              "limit": {"data.max_ngram_overlap": 0.018, "data.overlap_reason": "stock phrasing"},
              **overlap_report(rows(f"a {NINE}", "b", "c"), {"aime24": {"rows": rows(NINE, prefix="b")}})}
    data_dir = SweepPaths(resolved.results_dir).data_dir
    data_dir.mkdir(parents=True)
    (data_dir / "decontamination.json").write_text(json.dumps(report))
    data_row = next(r for r in load_fidelity(CONFIG_DIR / "fidelity" / "paper-rsi.yaml", resolved).rows
                    if r.element == "data")
    assert "derived.ngram_overlap=8-gram overlap of the training rows: aime24 1/3 rows (33.33%)" in data_row.ours
    text = "\n".join(overlap_lines(read_report(data_dir)))
    assert "Limit (`data.max_ngram_overlap`): 1.80% of the training rows per benchmark; the preset's reason: " \
           "stock phrasing." in text
    assert ("| aime24 | 1 (0) | 1 of 3 | 33.33% | 1 | 1 | `one two three four five six seven eight` (1) | t0 |"
            in text)
