"""harness/evaluation/driver.py: metric functions against hand-computed values, and real lm-eval runs (hf backend, CPU)
with tiny Llama models saved to tmp_path: a random one on every benchmark, and one trained to always answer 7
on the synthetic arithmetic task, so the metrics are non-trivial."""

import hashlib
import json
import math
import string
from pathlib import Path

import pytest
import torch
import yaml
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from harness.config.paths import REPO_ROOT
from harness.config.schema import BenchmarkConfig, EvalConfig
from harness.data.files import DataFileError, read_jsonl
from harness.data.prompts import render_prompt
from harness.evaluation import driver as ev
from harness.evaluation.driver import avg_at_k, majority_answer, majority_correct, pass_at_k, pass_levels, summarize

BENCHMARKS = ["math500", "gsm8k", "aime24", "aime25", "amc23", "minerva_math", "olympiadbench"]

# --- metrics ------------------------------------------------------------------------------------------------------


def test_avg_at_k():
    assert avg_at_k([True, False, False, True]) == 0.5
    assert avg_at_k([False]) == 0.0
    with pytest.raises(ValueError):
        avg_at_k([])


@pytest.mark.parametrize("n, c, k, expected", [
    (4, 0, 1, 0.0),
    (4, 1, 1, 0.25),  # pass@1 = c/n
    (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    (4, 3, 2, 1.0),  # n - c < k: every pair holds a correct sample
    (4, 1, 4, 1.0),
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_matches_the_binomial_formula():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_majority_vote():
    assert majority_answer(["2", "1", "2", None]) == "2"
    assert majority_answer(["1", "2"]) == "1"  # ties go to the earliest
    assert majority_answer([None, None]) is None
    assert majority_correct(["3", "5", "5", None], [True, False, False, False]) is False
    assert majority_correct(["3", "5", "3", "5", "3"], [True, False, True, False, True]) is True
    assert majority_correct([None, None], [False, False]) is False


def test_pass_levels():
    assert pass_levels(1) == [1]
    assert pass_levels(4) == [1, 2, 4]
    assert pass_levels(6) == [1, 2, 4, 6]
    assert pass_levels(32) == [1, 2, 4, 8, 16, 32]


def _row(pid, i, mode, correct, extracted, tokens=5, gradable=True, format_ok=True, timed_out=False):
    return {"id": pid, "sample": i, "mode": mode, "correct": correct, "extracted": extracted, "gradable": gradable,
            "format_ok": format_ok, "timed_out": timed_out, "response_tokens": tokens}


def test_summarize_on_constructed_samples():
    samples = [
        # p1: 1 of 4 correct, majority "5" is wrong
        _row("p1", 0, "sampled", True, "3", tokens=4), _row("p1", 1, "sampled", False, "5", tokens=8),
        _row("p1", 2, "sampled", False, "5", tokens=8, format_ok=False), _row("p1", 3, "sampled", False, None),
        # p2: 3 of 4 correct, majority right
        _row("p2", 0, "sampled", True, "7"), _row("p2", 1, "sampled", True, "7"),
        _row("p2", 2, "sampled", False, "1", timed_out=True), _row("p2", 3, "sampled", True, "7"),
        # p3: ungradable gold: excluded from accuracy, counted
        *[_row("p3", i, "sampled", False, "2", gradable=False) for i in range(4)],
        _row("p1", 0, "greedy", False, "5"), _row("p2", 0, "greedy", True, "7"),
        _row("p3", 0, "greedy", False, "2", gradable=False, tokens=8),
    ]
    m = summarize(samples, k=4, max_gen_toks=8)
    assert m["avg@4"] == pytest.approx((0.25 + 0.75) / 2)
    assert m["pass@1"] == pytest.approx((0.25 + 0.75) / 2)
    assert m["pass@2"] == pytest.approx(((1 - 3 / 6) + 1.0) / 2)  # p2: n - c = 1 < 2
    assert m["pass@4"] == 1.0
    assert m["maj@4"] == 0.5
    assert m["greedy_accuracy"] == 0.5
    assert m["n_gradable"] == 2 and m["ungradable"] == 1 and m["timed_out"] == 1
    assert m["mean_response_tokens"] == pytest.approx((4 + 8 + 8 + 5 * 9) / 12)
    assert m["clipped_rate"] == pytest.approx(2 / 12)
    assert m["format_ok_rate"] == pytest.approx(11 / 12)
    assert m["greedy_mean_response_tokens"] == pytest.approx(6)
    with pytest.raises(ValueError, match="expected k=4"):
        summarize(samples[:3], k=4, max_gen_toks=8)


def test_generation_kwargs_are_explicit():
    cfg = EvalConfig(temperature=0.6, top_p=0.95, max_gen_toks=64)
    sampled = ev.generation_kwargs(cfg, ("\nQ:",), "sampled")
    assert sampled == {"until": ["\nQ:"], "max_gen_toks": 64, "repetition_penalty": 1.0, "do_sample": True,
                       "temperature": 0.6, "top_p": 0.95, "top_k": 0}
    assert ev.generation_kwargs(cfg, (), "greedy") == {"until": [], "max_gen_toks": 64, "repetition_penalty": 1.0,
                                                        "do_sample": False}
    vllm = ev.generation_kwargs(EvalConfig(backend="vllm", max_gen_toks=64), (), "sampled")
    assert "top_k" not in vllm and vllm["max_gen_toks"] == 64


def test_vllm_missing_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(ev.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="vllm is not installed"):
        ev.model_args(tmp_path, EvalConfig(backend="vllm"), "cuda")


def test_vllm_model_args_carry_the_config(monkeypatch, tmp_path):
    monkeypatch.setattr(ev.importlib.util, "find_spec", lambda name: object())
    cfg = EvalConfig(backend="vllm", max_gen_toks=1024, seed=7)
    cfg.vllm.tensor_parallel_size, cfg.vllm.max_model_len = 2, 8192
    args = ev.model_args(tmp_path, cfg, "cuda")
    assert args["tensor_parallel_size"] == 2 and args["max_model_len"] == 8192 and args["seed"] == 7
    assert args["max_gen_toks"] == 1024 and args["add_bos_token"] is False


# --- end to end with lm-eval ----------------------------------------------------------------------------------------


def _char_tokenizer() -> PreTrainedTokenizerFast:
    chars = sorted(set(string.printable) - set("\r\x0b\x0c"))
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<eos>", "<unk>", *chars])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   clean_up_tokenization_spaces=False)


def _tiny_llama(tokenizer, max_positions: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=max_positions,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


@pytest.fixture(scope="module")
def random_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("random_llama")
    tokenizer = _char_tokenizer()
    _tiny_llama(tokenizer, max_positions=4096).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def answers_seven(tmp_path_factory) -> Path:
    """A tiny Llama trained for a few seconds to answer every "Q: ...\\n" with "Answer: 7" and EOS."""
    out = tmp_path_factory.mktemp("seven_llama")
    tokenizer = _char_tokenizer()
    model = _tiny_llama(tokenizer, max_positions=64)
    gen = torch.Generator().manual_seed(0)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(40):  # loss ~0.005 by then
        batch = []
        for _ in range(16):
            a, b = torch.randint(0, 100, (2,), generator=gen).tolist()
            prompt = tokenizer(f"Q: {a}+{b}\n", add_special_tokens=False)["input_ids"]
            target = tokenizer("Answer: 7", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            batch.append((prompt, target))
        width = max(len(p) + len(t) for p, t in batch)
        ids = torch.full((16, width), tokenizer.pad_token_id)
        labels = torch.full((16, width), -100)
        for row, (p, t) in enumerate(batch):
            ids[row, :len(p) + len(t)] = torch.tensor(p + t)
            labels[row, len(p):len(p) + len(t)] = torch.tensor(t)
        loss = model(input_ids=ids, labels=labels).loss  # right padding: causal attention never sees it
        optim.zero_grad()
        loss.backward()
        optim.step()
    assert loss.item() < 0.05
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _check_outputs(out_dir: Path, results: dict, n: int, k: int, greedy: bool) -> list[dict]:
    """samples.jsonl, results.json and lm-eval's own aggregate all tell the same story."""
    assert json.loads((out_dir / "results.json").read_text()) == results
    samples = read_jsonl(out_dir / "samples.jsonl", required=("id", "mode", "completion"))
    assert len(samples) == n * (k + int(greedy))
    assert results["n_problems"] == n
    metrics = dict(results["metrics"])
    assert metrics.pop("prompts_truncated") is not None
    assert metrics == summarize(samples, k, results["max_gen_toks"])
    lm = results["lm_eval_metrics"][f"harness_{results['bench']}__sampled"]
    if metrics["n_gradable"]:
        assert lm["avg_at_k"] == pytest.approx(metrics[f"avg@{k}"])
        assert lm["pass_at_k"] == pytest.approx(metrics[f"pass@{k}"])
        assert lm["maj_at_k"] == pytest.approx(metrics[f"maj@{k}"])
    assert lm["ungradable"] == metrics["ungradable"]
    if greedy:
        lm_greedy = results["lm_eval_metrics"][f"harness_{results['bench']}__greedy"]
        if metrics["n_gradable"]:
            assert lm_greedy["avg_at_k"] == pytest.approx(metrics["greedy_accuracy"])
    for row in samples:
        assert set(row) == {"id", "sample", "mode", "gold", "completion", "extracted", "correct", "format_ok",
                            "gradable", "timed_out", "response_tokens"}
        assert row["response_tokens"] <= results["max_gen_toks"]
    return samples


@pytest.mark.parametrize("bench", BENCHMARKS)
def test_every_benchmark_runs_end_to_end(random_model, tmp_path, bench):
    data_file = REPO_ROOT / "data" / "benchmarks" / f"{bench}.jsonl"
    cfg = EvalConfig(k=2, max_gen_toks=8, batch_size=8)
    out = tmp_path / "eval"
    results = ev.evaluate_benchmark(random_model, bench, BenchmarkConfig(file=str(data_file), limit=3), data_file,
                                    cfg, "qwen_boxed", out)
    samples = _check_outputs(out, results, n=3, k=2, greedy=True)
    rows = read_jsonl(data_file)[:3]
    assert [s["id"] for s in samples if s["mode"] == "greedy"] == [r["id"] for r in rows]
    assert results["data_sha256"] == hashlib.sha256(data_file.read_bytes()).hexdigest()
    assert results["data_file"] == f"data/benchmarks/{bench}.jsonl"
    assert results["backend"] == "hf" and results["versions"]["lm_eval"] == "0.4.13"
    docs = read_jsonl(out / "lm_eval" / "docs.jsonl", required=("prompt",))
    assert [d["prompt"] for d in docs] == [render_prompt("qwen_boxed", r["problem"]) for r in rows]
    task = yaml.safe_load((out / "lm_eval" / f"harness_{bench}__sampled.yaml").read_text())
    assert task["include"].endswith(f"harness/evaluation/tasks/{bench}.yaml") and task["repeats"] == 2
    assert not (out / "lm_eval" / ev.HF_CACHE).exists()
    # the k samples are independent draws, not one completion copied k times
    sampled = [s["completion"] for s in samples if s["mode"] == "sampled"]
    assert len(set(sampled)) > 1


def _arith_file(folder: Path, golds: list[str]) -> Path:
    rows = [{"id": f"arith-{i}", "problem": f"{i}+{i}", "answer": g, "source": "arith"} for i, g in enumerate(golds)]
    path = folder / "eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "SHA256SUMS").write_text(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  eval.jsonl\n")
    return path


def test_arith_with_a_model_that_always_answers_seven(answers_seven, tmp_path):
    data_file = _arith_file(tmp_path, ["7", "7", "3", "12"])
    cfg = EvalConfig(k=4, temperature=0.7, max_gen_toks=16, batch_size=16, seed=3)
    out = tmp_path / "eval"
    results = ev.evaluate_benchmark(answers_seven, "arith_ood", BenchmarkConfig(file="x", scorer="numeric"),
                                    data_file, cfg, "tiny", out)
    samples = _check_outputs(out, results, n=4, k=4, greedy=True)
    greedy = [s for s in samples if s["mode"] == "greedy"]
    assert [s["completion"] for s in greedy] == ["Answer: 7"] * 4  # stops at EOS, no trailing text
    assert results["metrics"]["greedy_accuracy"] == 0.5
    assert results["metrics"]["greedy_format_ok_rate"] == 1.0
    assert results["metrics"]["maj@4"] == 0.5
    assert 0.0 < results["metrics"]["avg@4"] <= 0.5
    assert results["stop_sequences"] == ["\nQ:"] and results["scorer"] == "numeric"
    task = yaml.safe_load((out / "lm_eval" / "harness_arith_ood__sampled.yaml").read_text())
    assert task["include"].endswith("harness/evaluation/tasks/_default_template_yaml")  # no variant for arith_ood


def test_limit_and_no_greedy(answers_seven, tmp_path):
    data_file = _arith_file(tmp_path, ["7", "1", "7"])
    cfg = EvalConfig(k=1, max_gen_toks=12, greedy=False, temperature=0.0)
    results = ev.evaluate_benchmark(answers_seven, "arith", BenchmarkConfig(file="x", scorer="numeric", limit=2),
                                    data_file, cfg, "tiny", tmp_path / "eval")
    samples = _check_outputs(tmp_path / "eval", results, n=2, k=1, greedy=False)
    assert [s["mode"] for s in samples] == ["sampled", "sampled"]
    assert results["metrics"]["avg@1"] == 0.5 and "greedy_accuracy" not in results["metrics"]


def test_checksum_is_verified_before_any_model_work(tmp_path):
    data_file = _arith_file(tmp_path, ["7"])
    data_file.write_text(data_file.read_text().replace('"7"', '"8"'))
    with pytest.raises(DataFileError, match="eval.jsonl: sha256 mismatch"):
        ev.evaluate_benchmark(tmp_path / "no-model-here", "arith", BenchmarkConfig(file="x", scorer="numeric"),
                              data_file, EvalConfig(), "tiny", tmp_path / "eval")
    assert not (tmp_path / "eval").exists()


def test_environment_probe_skipped_only_inside():
    """lm-eval's per-call environment probe (torch collect_env, git hash) is a no-op inside the context, and lm-eval's
    own functions are back afterwards, also after an error."""
    import lm_eval.evaluator as evaluator

    saved = evaluator.add_env_info, evaluator.get_git_commit_hash
    with pytest.raises(RuntimeError), ev.without_environment_probe():
        storage = {}
        evaluator.add_env_info(storage)
        assert storage == {} and evaluator.get_git_commit_hash() is None
        raise RuntimeError("inside")
    assert (evaluator.add_env_info, evaluator.get_git_commit_hash) == saved


def test_task_yamls_work_standalone(monkeypatch):
    """The variants are also plain lm-eval tasks (``lm-eval run --include_path harness/evaluation/tasks``) from the
    repo root."""
    from lm_eval.tasks import TaskManager

    monkeypatch.chdir(REPO_ROOT)
    manager = TaskManager(include_path=str(ev.TASKS_DIR), include_defaults=False)
    assert set(manager.all_subtasks) == {f"harness_{b}" for b in [*BENCHMARKS, "arith"]}
    task = manager.load(["harness_amc23"])["tasks"]["harness_amc23"]
    doc = task.test_docs()[0]
    row = read_jsonl(REPO_ROOT / "data" / "benchmarks" / "amc23.jsonl")[0]
    assert task.doc_to_text(doc) == render_prompt("qwen_boxed", row["problem"])
    assert doc["scorer"] == "math_verify"
    assert task.config.filter_list[0]["name"] == "all"
    result = task.process_results(doc, [[f"\\boxed{{{row['answer']}}}", "\\boxed{0}"]])
    assert result["avg_at_k"] == 0.5 and result["pass_at_k"] == 1.0 and result["ungradable"] == 0.0


def test_sampling_is_reproducible_from_the_seed(random_model, tmp_path):
    data_file = _arith_file(tmp_path, ["1", "2"])
    bench = BenchmarkConfig(file="x", scorer="numeric")

    def completions(seed, name):
        cfg = EvalConfig(k=3, max_gen_toks=8, greedy=False, seed=seed)
        ev.evaluate_benchmark(random_model, "arith", bench, data_file, cfg, "tiny", tmp_path / name)
        return [r["completion"] for r in read_jsonl(tmp_path / name / "samples.jsonl", required=("id",))]

    first = completions(11, "a")
    assert completions(11, "b") == first
    assert completions(12, "c") != first


def test_fast_decode_gives_lm_evals_own_completions(random_model, tmp_path, monkeypatch):
    # eval.fast_decode: lm-eval's generate calls go through harness/model/decode.py (FastDecodeHFLM); the same
    # completions and metrics as lm-eval's HFLM, greedy and sampled, prompts of different lengths in one batch
    from harness.model import decode

    data_file = _arith_file(tmp_path, [str(i) for i in range(12)])  # "0+0" ... "11+11": left padding in a batch
    bench = BenchmarkConfig(file="x", scorer="numeric")
    calls = []
    sample = decode.sample
    monkeypatch.setattr(decode, "sample", lambda *args, **kwargs: calls.append(1) or sample(*args, **kwargs))

    def run(fast_decode):
        cfg = EvalConfig(k=3, temperature=0.8, top_p=0.9, max_gen_toks=12, batch_size=8, seed=5,
                         fast_decode=fast_decode)
        out = tmp_path / str(fast_decode)
        results = ev.evaluate_benchmark(random_model, "arith", bench, data_file, cfg, "tiny", out)
        return read_jsonl(out / "samples.jsonl", required=("id",)), results["metrics"]

    plain = run(False)
    assert calls == []
    assert run(True) == plain and len(calls) >= 2  # greedy and sampled batches
    assert len({s["completion"] for s in plain[0] if s["mode"] == "sampled"}) > 1


def test_a_shared_checkpoint_model_gives_each_benchmark_its_own_samples(random_model, tmp_path):
    """`harness eval` loads a checkpoint's model and tokenizer once for all its benchmarks (load_checkpoint): each
    benchmark still gets exactly the samples a model built for it alone gives, whichever benchmark ran first."""
    cfg = EvalConfig(k=3, temperature=0.9, max_gen_toks=8, seed=3)
    for name in "ab":
        (tmp_path / name).mkdir()
    files = {name: _arith_file(tmp_path / name, golds) for name, golds in (("a", ["1", "2"]), ("b", ["3", "4", "5"]))}
    bench = BenchmarkConfig(file="x", scorer="numeric")

    def samples(name, out, loaded=None):
        ev.evaluate_benchmark(random_model, "arith", bench, files[name], cfg, "tiny", out, loaded=loaded)
        return read_jsonl(out / "samples.jsonl", required=("id",))

    alone = {name: samples(name, tmp_path / f"alone-{name}") for name in files}
    loaded = ev.load_checkpoint(random_model, cfg)
    assert loaded.lm is not None  # hf: one lm-eval model for the checkpoint
    for order in (("a", "b"), ("b", "a")):
        for name in order:
            assert samples(name, tmp_path / f"shared-{''.join(order)}-{name}", loaded) == alone[name]
    with pytest.raises(ValueError, match="loaded checkpoint"):
        ev.evaluate_benchmark(tmp_path, "arith", bench, files["a"], cfg, "tiny", tmp_path / "x", loaded=loaded)
