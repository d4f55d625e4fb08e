"""Procedurally generated multi-step arithmetic with worked steps: the embedded default task.

A problem is ``terms`` integers, each of 1 to ``digits`` digits (width drawn uniformly), joined by + and -,
e.g. ``8+7-3+0``. The worked solution evaluates left to right, one line per step, and ends with the final answer::

    8+7=15
    15-3=12
    12+0=12
    Answer: 12

The supervised warm start learns from the ``solution`` text, in which a fraction ``slip_rate`` of the training
rows carries one arithmetic slip (a step result off by 1 or 2, carried on to the final line). The row's
``answer`` is always the true value, which is what rewards and evaluation check. So the warm-started policy
makes slips with some probability: RL with a correctness reward has a real, learnable signal (lower the slip
rate), much like RLVR sharpening a model whose sampled answers are less reliable than its greedy ones.

Splits are deterministic by seed and disjoint by construction: a problem belongs to ``eval`` when the first
byte of its sha256 is below 26 (about 10% of all problems), otherwise to ``train``; each split samples only
problems that hash into it. The out-of-distribution split has more terms (``ood_terms``), so it shares no
problem with either.
"""

from __future__ import annotations

import hashlib
import random

from harness.config.schema import SyntheticConfig

EVAL_HASH_BELOW = 26  # of 256: ~10% of the problem space is reserved for evaluation


def split_of(problem: str) -> str:
    return "eval" if hashlib.sha256(problem.encode()).digest()[0] < EVAL_HASH_BELOW else "train"


def _random_problem(rng: random.Random, terms: int, digits: int) -> tuple[str, list[int], list[str]]:
    widths = [rng.randint(1, digits) for _ in range(terms)]
    numbers = [rng.randrange(10 ** (w - 1) if w > 1 else 0, 10**w) for w in widths]
    ops = [rng.choice("+-") for _ in range(terms - 1)]
    text = str(numbers[0]) + "".join(op + str(n) for op, n in zip(ops, numbers[1:], strict=True))
    return text, numbers, ops


def worked_solution(numbers: list[int], ops: list[str], slip_step: int | None = None,
                    slip: int = 0) -> tuple[str, int]:
    """The step-by-step solution text and its final value; ``slip`` is added to the result of step
    ``slip_step`` (an arithmetic slip that the following steps carry on from)."""
    lines, value = [], numbers[0]
    for step, (op, n) in enumerate(zip(ops, numbers[1:], strict=True)):
        new = (value + n if op == "+" else value - n) + (slip if step == slip_step else 0)
        lines.append(f"{value}{op}{n}={new}")
        value = new
    lines.append(f"Answer: {value}")
    return "\n".join(lines), value


def generate_split(cfg: SyntheticConfig, split: str) -> list[dict]:
    """Rows {id, problem, answer, solution, source} of one split ("train", "eval" or "ood")."""
    sizes = {"train": cfg.n_train, "eval": cfg.n_eval, "ood": cfg.n_ood}
    if split not in sizes:
        raise ValueError(f"split must be one of {list(sizes)}, got {split!r}")
    terms = cfg.ood_terms if split == "ood" else cfg.terms
    rng = random.Random(f"{cfg.seed}-{split}")
    rows, seen = [], set()
    attempts, max_attempts = 0, 200 * sizes[split] + 10_000
    while len(rows) < sizes[split]:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(f"synthetic: cannot draw {sizes[split]} distinct {split} problems with "
                             f"terms={terms}, digits={cfg.digits}; lower data.synthetic.n_{split}")
        text, numbers, ops = _random_problem(rng, terms, cfg.digits)
        if text in seen or (split != "ood" and split_of(text) != split):
            continue
        seen.add(text)
        _, value = worked_solution(numbers, ops)
        slip_step, slip = None, 0
        if split == "train" and rng.random() < cfg.slip_rate:
            slip_step, slip = rng.randrange(len(ops)), rng.choice((-2, -1, 1, 2))
        solution, _ = worked_solution(numbers, ops, slip_step, slip)
        rows.append({"id": f"arith-{split}-{len(rows):06d}", "problem": text, "answer": str(value),
                     "solution": solution, "source": f"arith_{split}"})
    return rows
