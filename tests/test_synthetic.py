"""The embedded arithmetic task: deterministic, disjoint splits, correct worked solutions."""

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config.schema import SyntheticConfig
from harness.data.scoring import score_numeric
from harness.data.synthetic import generate_split, split_of, worked_solution

SMALL = SyntheticConfig(n_train=500, n_eval=100, n_ood=100)


def test_same_seed_same_rows_other_seed_other_rows():
    assert generate_split(SMALL, "train") == generate_split(SMALL, "train")
    other = SyntheticConfig(n_train=500, n_eval=100, n_ood=100, seed=SMALL.seed + 1)
    assert generate_split(other, "train") != generate_split(SMALL, "train")


def test_splits_are_disjoint_and_ood_is_harder():
    train = {r["problem"] for r in generate_split(SMALL, "train")}
    evals = {r["problem"] for r in generate_split(SMALL, "eval")}
    ood = generate_split(SMALL, "ood")
    assert not train & evals
    assert not {r["problem"] for r in ood} & (train | evals)
    assert all(r["problem"].count("+") + r["problem"].count("-") == SMALL.ood_terms - 1 for r in ood)
    assert all(split_of(p) == "eval" for p in evals) and all(split_of(p) == "train" for p in train)


def test_rows_have_unique_ids_and_consistent_answers():
    rows = generate_split(SMALL, "eval")
    assert len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        assert int(row["answer"]) == eval(row["problem"])  # the problem is plain integer arithmetic
        assert row["solution"].endswith(f"Answer: {row['answer']}")
        assert score_numeric(row["solution"], row["answer"]).correct


@given(st.lists(st.integers(0, 99), min_size=2, max_size=6), st.data())
@settings(max_examples=50, deadline=None)
def test_worked_solution_steps_are_each_correct(numbers, data):
    ops = data.draw(st.lists(st.sampled_from("+-"), min_size=len(numbers) - 1, max_size=len(numbers) - 1))
    text, value = worked_solution(numbers, ops)
    lines = text.splitlines()
    assert len(lines) == len(numbers)  # one line per operation plus the answer line
    for line in lines[:-1]:
        left, right = line.split("=")
        assert eval(left) == int(right)
    assert lines[-1] == f"Answer: {value}"
