"""harness/data/scoring.py: the numeric and math-verify scorers, their timeout, threads and hostile inputs."""

import threading
import time

import pytest

from harness.config.paths import REPO_ROOT
from harness.data import scoring
from harness.data.files import read_jsonl
from harness.data.scoring import Score, last_boxed, normalize_answer, score_batch, score_math_verify, score_numeric

TIMEOUT_S = 5.0

# (completion, gold, correct) for math_verify; golds are written as in data/benchmarks (bare LaTeX).
MATH_VERIFY_TABLE = [
    # fractions
    ("so $x = \\boxed{\\frac{3}{4}}$", "\\frac34", True),
    ("\\boxed{0.75}", "\\frac{3}{4}", True),
    ("\\boxed{3/4}", "\\frac{3}{4}", True),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", True),
    ("\\boxed{\\frac{4}{3}}", "\\frac{3}{4}", False),
    # tuples: order matters
    ("The answer is $\\boxed{(3, \\frac{\\pi}{2})}$", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("\\boxed{(\\frac{\\pi}{2}, 3)}", "\\left( 3, \\frac{\\pi}{2} \\right)", False),
    # intervals: open/closed ends matter
    ("\\boxed{[-2, 7]}", "[-2,7]", True),
    ("\\boxed{(-2, 7]}", "[-2,7]", False),
    ("\\boxed{(-\\infty, 0) \\cup (1, \\infty)}", "(-\\infty,0)\\cup(1,\\infty)", True),
    ("\\boxed{x \\in [2, 5)}", "[2,5)", True),
    # units and \text{}
    ("\\boxed{10\\text{ cm}}", "10", True),
    ("\\boxed{10 \\mbox{ inches}}", "10", True),
    ("\\boxed{\\text{(C)}}", "\\text{(C)}", True),
    ("\\boxed{\\text{Evelyn}}", "\\text{Evelyn}", True),
    ("\\boxed{\\text{Tuesday}}", "\\text{Evelyn}", False),
    # scientific notation (minerva answers were rewritten to LaTeX, see data/README.md)
    ("\\boxed{3.83 \\times 10^{35}}", "3.83 \\times 10^{35}", True),
    ("\\boxed{1.5 \\times 10^{-3}}", "0.0015", True),
    ("\\boxed{3.8 \\times 10^{35}}", "3.83 \\times 10^{35}", False),
    ("\\boxed{3.83e35}", "3.83 \\times 10^{35}", True),  # Python-style, as Minerva's own solutions write it
    ("\\boxed{4e33}", "4 \\times 10^{33}", True),
    # degrees
    ("\\boxed{30^\\circ}", "30^\\circ", True),
    ("\\boxed{30}", "30^\\circ", True),
    ("\\boxed{30^{\\circ}}", "30", True),
    # percent gold (olympiadbench): the trailing % is dropped from the gold
    ("\\boxed{62.5}", "62.5%", True),
    ("\\boxed{62.5\\%}", "62.5%", True),
    ("\\boxed{17.5%}", "17.5%", True),  # a bare % inside a box is a LaTeX comment without the rewrite
    # MATH shorthand: \frac14, 11\sqrt2 (math-verify's malformed-operator repair)
    ("\\boxed{\\frac14}", "\\frac{1}{4}", True),
    ("\\boxed{11\\sqrt2}", "11\\sqrt{2}", True),
    # sets, radicals, expressions, thousands separators, equations
    ("\\boxed{2, 1}", "1, 2", True),
    ("\\boxed{\\sqrt{18}}", "3\\sqrt2", True),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", True),
    ("\\boxed{1,000}", "1000", True),
    ("\\boxed{x=4}", "4", True),
    ("\\boxed{2\\pi}", "2\\pi", True),
    ("\\boxed{6.28}", "2\\pi", False),
    # wrong answers and empty output
    ("\\boxed{-5}", "5", False),
    ("", "5", False),
    ("I do not know.", "5", False),
    # the LAST box counts (a corrected answer)
    ("First \\boxed{3}, then corrected: \\boxed{5}", "5", True),
    ("First \\boxed{5}, then corrected: \\boxed{3}", "5", False),
    # no box: math-verify's other extraction
    ("The final answer is $\\frac{1}{2}$.", "\\frac{1}{2}", True),
    ("so the total is 42", "42", True),
    ("\\boxed{???} but the answer is $3$", "3", True),
]


def test_math_verify_table():
    completions, golds, expected = zip(*MATH_VERIFY_TABLE, strict=True)
    scores = score_batch(list(completions), list(golds), "math_verify", TIMEOUT_S)
    wrong = [(c, g, s) for (c, g, e), s in zip(MATH_VERIFY_TABLE, scores, strict=True) if s.correct != e]
    assert not wrong
    assert all(s.gradable and not s.timed_out for s in scores)


def test_math_verify_fields():
    boxed = score_math_verify("steps...\n\\boxed{\\frac{1}{2}}", "\\frac12", TIMEOUT_S)
    assert boxed == Score(correct=True, extracted="\\frac{1}{2}", format_ok=True, gradable=True, timed_out=False)
    unboxed = score_math_verify("so the total is 42", "42", TIMEOUT_S)
    assert unboxed.correct and unboxed.extracted == "42" and not unboxed.format_ok
    empty = score_math_verify("", "5", TIMEOUT_S)
    assert empty == Score(correct=False, extracted=None, format_ok=False, gradable=True, timed_out=False)


def test_ungradable_gold_is_flagged_not_scored_wrong():
    gold = "\\frac{dM}{dt}=\\frac{10^{5} L_{\\odot}}{0.007 c^{2} M_{\\odot}^{6}} M^{6}"  # minerva-072-like
    score = score_math_verify("\\boxed{5}", gold, TIMEOUT_S)
    assert not score.gradable and not score.correct and score.format_ok


@pytest.mark.parametrize("completion, gold, expected", [
    ("12+34=46\n46-5=41\nAnswer: 41", "41", Score(True, "41", True, True, False)),
    ("Answer: 3\nAnswer: 41", "41", Score(True, "41", True, True, False)),  # the last Answer: counts
    ("Answer: 41\nAnswer: 3", "41", Score(False, "3", True, True, False)),
    ("12+34=46\n46-5=41", "41", Score(False, None, False, True, False)),
    ("Answer: forty-one", "41", Score(False, None, True, True, False)),
    ("Answer: 041", "41", Score(True, "41", True, True, False)),
    ("Answer: -7", "-7", Score(True, "-7", True, True, False)),
    ("Answer: 7", "-7", Score(False, "7", True, True, False)),
    ("Answer: -0", "0", Score(True, "0", True, True, False)),
    ("", "5", Score(False, None, False, True, False)),
    ("Answer: 5", "five", Score(False, "5", True, False, False)),
])
def test_numeric(completion, gold, expected):
    assert score_numeric(completion, gold) == expected
    assert score_batch([completion], [gold], "numeric", TIMEOUT_S) == [expected]


def test_numeric_handles_a_megabyte_of_digits_quickly():
    digits = "9" * 1_000_000
    start = time.monotonic()
    score = score_numeric("Answer: " + digits, digits)  # int() would refuse > 4300 digits
    assert score.correct and time.monotonic() - start < 1.0


def test_last_boxed_balances_braces_and_is_linear():
    assert last_boxed("a \\boxed{\\frac{1}{2}} b \\boxed{x^{2}}") == "x^{2}"
    assert last_boxed("\\boxed{1} then \\boxed{2") == "1"  # an unclosed box is not an answer
    assert last_boxed("\\boxed {7}") == "7"
    assert last_boxed("no box") is None
    start = time.monotonic()
    assert last_boxed("\\boxed{" * 200_000) is None
    assert time.monotonic() - start < 2.0


def test_scoring_from_threads():
    results = {}

    def work(i):
        results[i] = score_math_verify(f"\\boxed{{{i}}}", str(i), TIMEOUT_S)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[i].correct for i in range(4))


HOSTILE = {
    "megabyte_of_digits": "1" * 1_000_000,
    "nested_fracs_in_box": "\\boxed{" + "\\frac{1}{" * 5000 + "2" + "}" * 5000 + "}",
    "unclosed_boxes": "\\boxed{" * 100_000,
    "nested_sqrt": "$" + "\\sqrt{" * 3000 + "2" + "}" * 3000 + "$",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_completion_returns_within_timeout(name):
    timeout_s = 1.5
    # a warm worker, as mid-batch (an uncached item: a worker restarted by the previous test may still be importing)
    assert score_math_verify(f"\\boxed{{{time.time_ns()}}}", "1", TIMEOUT_S).gradable
    start = time.monotonic()
    score = score_math_verify(HOSTILE[name], "2", timeout_s)
    elapsed = time.monotonic() - start
    assert elapsed < timeout_s + 1.0, f"{name} took {elapsed:.1f}s"
    assert not score.correct
    # the next item gets a fresh worker and is scored normally
    assert score_math_verify("\\boxed{3}", "3", TIMEOUT_S).correct


def test_timeout_marks_the_item_and_the_batch_goes_on():
    # The worker imports first (not timed here); then a boxed integer scores in ~2 ms and the megabyte of digits
    # takes ~0.6 s on a fast 2-core machine (more on slower ones): a 0.1 s timeout separates them on any machine,
    # where 1.0 s did not (the fast machine parsed the megabyte within it).
    score_batch(["\\boxed{7}"], ["7"], "math_verify", TIMEOUT_S)
    scores = score_batch(["\\boxed{1}", HOSTILE["megabyte_of_digits"], "\\boxed{2}"], ["1", "5", "2"],
                         "math_verify", 0.1)
    assert [s.correct for s in scores] == [True, False, True]
    assert scores[1].timed_out and not scores[0].timed_out and not scores[2].timed_out


def test_repeated_items_are_served_from_the_cache(monkeypatch):
    score_batch(["\\boxed{11}"], ["11"], "math_verify", TIMEOUT_S)

    def no_worker(size):
        raise AssertionError("a cached item must not reach the worker")

    monkeypatch.setattr(scoring, "_pool", no_worker)
    assert score_batch(["\\boxed{11}"], ["11"], "math_verify", TIMEOUT_S)[0].correct


def test_worker_that_dies_is_replaced():
    score_math_verify("\\boxed{1}", "1", TIMEOUT_S)
    scoring._WORKERS[scoring.os.getpid()][0].proc.kill()
    assert score_math_verify("\\boxed{12}", "12", TIMEOUT_S).correct


def test_bad_arguments():
    with pytest.raises(ValueError, match="known scorers"):
        score_batch(["x"], ["1"], "exact", TIMEOUT_S)
    with pytest.raises(ValueError, match="2 golds"):
        score_batch(["x"], ["1", "2"], "numeric", TIMEOUT_S)


def test_normalize_answer():
    assert normalize_answer("3.83e35") == "3.83 \\times 10^{35}"
    assert normalize_answer("1.2E-5") == "1.2 \\times 10^{-5}"
    assert normalize_answer(" 8 \\% ") == "8"
    for untouched in ("2e", "e5", "a1e5", "10^{35}", "\\frac{1}{2}"):
        assert normalize_answer(untouched) == untouched


def test_math500_reference_solutions_score_correct():
    """Every MATH-500 reference solution (last box = the answer) must grade correct against its own answer."""
    rows = read_jsonl(REPO_ROOT / "data" / "benchmarks" / "math500.jsonl")[::5]
    scores = score_batch([r["solution"] for r in rows], [r["answer"] for r in rows], "math_verify", TIMEOUT_S)
    assert [r["id"] for r, s in zip(rows, scores, strict=True) if not s.correct] == []


def test_forked_child_gets_its_own_worker():
    import multiprocessing

    score_math_verify("\\boxed{1}", "1", TIMEOUT_S)  # the parent's worker exists before the fork
    with multiprocessing.get_context("fork").Pool(1) as pool:
        child = pool.apply(score_math_verify, ("\\boxed{4}", "4", TIMEOUT_S))
    assert child.correct
    assert score_math_verify("\\boxed{5}", "5", TIMEOUT_S).correct  # the parent's worker is untouched


def test_a_pool_of_workers_gives_the_serial_scores_and_times_out_only_the_slow_item():
    completions = [c for c, _, _ in MATH_VERIFY_TABLE] + [HOSTILE["megabyte_of_digits"]]
    golds = [g for _, g, _ in MATH_VERIFY_TABLE] + ["5"]
    scoring._CACHE.clear()
    serial = score_batch(completions[:-1], golds[:-1], "math_verify", TIMEOUT_S)
    scoring._CACHE.clear()
    score_batch(["\\boxed{7}"] * 3, ["7", "8", "9"], "math_verify", TIMEOUT_S, workers=3)  # the pool starts
    scoring._CACHE.clear()
    pooled = score_batch(completions, golds, "math_verify", TIMEOUT_S, workers=3)
    assert pooled[:-1] == serial
    assert len(scoring._WORKERS[scoring.os.getpid()]) == 3
    scoring._CACHE.clear()
    scores = score_batch(["\\boxed{1}", HOSTILE["megabyte_of_digits"], "\\boxed{2}", "\\boxed{3}"],
                         ["1", "5", "2", "3"], "math_verify", 0.1, workers=2)
    assert [(s.correct, s.timed_out) for s in scores] == [(True, False), (False, True), (True, False), (True, False)]


def test_a_pool_worker_that_dies_mid_batch_is_replaced_and_its_item_retried():
    score_batch(["\\boxed{7}"] * 2, ["7", "8"], "math_verify", TIMEOUT_S, workers=2)
    for worker in scoring._WORKERS[scoring.os.getpid()][:2]:
        worker.wait_ready()  # started and ready: killed now, each dies under an item (or is seen dead at once)
        worker.proc.kill()
    scores = score_batch([f"\\boxed{{{n}}}" for n in range(20, 26)], [str(n) for n in range(20, 26)],
                         "math_verify", TIMEOUT_S, workers=2)
    assert all(s.correct and not s.timed_out for s in scores)


def test_a_completion_repeated_in_a_batch_is_scored_once(monkeypatch):
    seen = []
    original = scoring._score_on_pool
    monkeypatch.setattr(scoring, "_score_on_pool", lambda items, *a: seen.extend(items) or original(items, *a))
    scores = score_batch(["\\boxed{31}", "\\boxed{31}", "\\boxed{32}"], ["31", "31", "31"], "math_verify", TIMEOUT_S)
    assert [s.correct for s in scores] == [True, True, False] and len(seen) == 2
