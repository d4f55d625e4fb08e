"""Hooks for the task YAMLs in this folder: prompt rendering, the keep-all-samples filter, per-problem scoring.

lm-eval imports this file by path (``!function utils.x``), not as ``harness.tasks.utils``, so the repo root is put
on ``sys.path`` to reach ``harness.data.scoring`` when lm-eval runs from the command line.

Each doc reaching ``process_results`` carries ``prompt``, ``scorer`` and ``scoring_timeout_s``: set by the
``process_docs_*`` hooks for standalone runs, or already in the docs file that ``harness.evaluation.driver`` writes.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

_REPO_ROOT = str(Path(__file__).resolve().parents[3])
if _REPO_ROOT not in sys.path:
    sys.path.append(_REPO_ROOT)

from harness.data.prompts import render_prompt  # noqa: E402
from harness.data.scoring import score_batch  # noqa: E402
from harness.evaluation.driver import avg_at_k, majority_correct  # noqa: E402

DEFAULT_TIMEOUT_S = 5.0  # EvalConfig.scoring_timeout_s default


def _add_fields(dataset, template: str, scorer: str):
    def add(doc):
        return {"prompt": render_prompt(template, doc["problem"]), "scorer": scorer,
                "scoring_timeout_s": DEFAULT_TIMEOUT_S}

    return dataset.map(add)


def process_docs_qwen_boxed(dataset):
    """Competition maths: the Qwen-math boxed prompt, math-verify scoring."""
    return _add_fields(dataset, "qwen_boxed", "math_verify")


def process_docs_arith(dataset):
    """Synthetic arithmetic: the ``tiny`` prompt, exact integer match of ``Answer:``."""
    return _add_fields(dataset, "tiny", "numeric")


def keep_all_samples(resps, docs):
    """Identity filter: each doc keeps all of its ``repeats`` completions (the default keeps only the first)."""
    return resps


def process_results(doc: dict, results: list) -> dict[str, float | None]:
    """Score one problem's k completions; None marks a metric undefined because the gold is ungradable."""
    completions = results[0] if isinstance(results[0], list) else list(results)
    scores = score_batch(completions, [doc["answer"]] * len(completions), doc["scorer"],
                         float(doc.get("scoring_timeout_s") or DEFAULT_TIMEOUT_S))
    gradable = all(s.gradable for s in scores)
    correct = [s.correct for s in scores]
    return {
        "avg_at_k": avg_at_k(correct) if gradable else None,
        "pass_at_k": float(any(correct)) if gradable else None,
        "maj_at_k": float(majority_correct([s.extracted for s in scores], correct)) if gradable else None,
        "format_ok": sum(s.format_ok for s in scores) / len(scores),
        "ungradable": 0.0 if gradable else 1.0,
        "timed_out": float(sum(s.timed_out for s in scores)),
    }


def mean_gradable(items: list[float | None]) -> float:
    """Mean over problems whose gold could be read; NaN when there are none."""
    values = [v for v in items if v is not None]
    return sum(values) / len(values) if values else math.nan


def total(items: list[float]) -> float:
    return float(sum(items))
