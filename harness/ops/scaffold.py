"""``harness new-method NAME``: a method module, its config and a test that runs, ready to fill in.

The module registers itself (``@register_method``) and the registry imports every module of ``methods/``, so
nothing else is edited. A method in another package registers through the ``harness.methods`` entry point group
instead (README, "Add a method")."""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from harness.config.paths import REPO_ROOT

MODULE = '''"""{title}: <one line on what the method targets>.

Formula: <the paper's equation, restated>.
Source: <paper, arXiv id>; official code: <repo @ commit, or "none found">.
Deviations: <each difference from the paper / official code, or "none">.
"""

from dataclasses import dataclass

import torch

from methods.base import (
    Method,
    RolloutBatch,
    StepContext,
    TokenStats,
    TokenWeights,
    aggregate,
)
from methods.declaration import check_declared, setting
from methods.entropy import quantile_entropy_mask
from methods.registry import register_method


@register_method("{name}")
class {cls}(Method):
    needs = frozenset({{"entropy"}})  # statistics beyond logp this method reads (methods.base.STATISTICS)
    deviations = ()

    @dataclass
    class Config:
        # one setting(default, doc, choices=..., low=..., high=...) per field: docs/config-reference.md shows them
        rho: float = setting(0.2, "Fraction of completion tokens kept (the paper's default).", low=0.0,
                             low_open=True, high=1.0)

        def __post_init__(self):
            check_declared(self, "method.")  # a value outside its declared choices or range; then rules across fields

    def token_weights(self, stats: TokenStats, batch: RolloutBatch, ctx: StepContext) -> TokenWeights:
        if stats.entropy is None:
            raise ValueError("method '{name}' needs stats.entropy (declared in {cls}.needs)")
        mask = batch.completion_mask > 0  # (B, T)
        # S = M & (H >= quantile(H[M], 1 - rho)): replace with the paper's rule. The helper is the entropy method's
        # (TRL semantics), which also works past torch.quantile's input size limit and on an empty mask.
        selected, _ = quantile_entropy_mask(stats.entropy.detach(), mask, self.config.rho)
        selected = selected.to(torch.float32)
        n = int(mask.sum())
        # the run's aggregation (train.aggregation) over the selected tokens: L = sum_S l / |S| under token-mean;
        # aggregate(batch.completion_mask, ctx, metrics, trained=selected) would divide by every token instead
        return aggregate(selected, ctx, {{"tokens_selected_frac": float(selected.sum()) / max(n, 1)}})
'''

CONFIG = """# {title}: overrides of methods/{name}.py Config (its defaults are the paper's).
method: {name}
"""

TEST = '''"""Tests for methods/{name}.py: replace the example with hand-computed cases from the paper."""

import torch

from harness.train.hooks import new_rollout_batch, run_hooks
from methods.base import StepContext, TokenStats
from methods.registry import get_method_class


def test_{name}_keeps_some_tokens_and_no_padding():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    batch = new_rollout_batch(torch.zeros(2, 4, dtype=torch.long), mask, torch.tensor([1.0, 0.0]),
                              torch.tensor([0, 0]), scale_rewards="group")
    entropy = torch.tensor([[0.1, 0.9, 0.5, 0.0], [0.2, 0.8, 0.3, 0.4]])
    method = get_method_class("{name}")()

    def stats_for(prepared):
        logp = torch.zeros(prepared.batch.completion_mask.shape)
        return TokenStats(logp=logp, old_logp=logp, entropy=entropy[prepared.rows][:, :prepared.length])

    out = run_hooks(method, batch, stats_for, StepContext(max_completion_length=4))
    assert out.weights[mask == 0].eq(0).all()
    assert out.weights.gt(0).any()
    assert 0.0 < out.metrics["tokens_selected_frac"] <= 1.0
'''


def scaffold_method(name: str, root: Path = REPO_ROOT) -> list[Path]:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise ValueError(f"method name {name!r} must be a lowercase Python identifier (letters, digits, _)")
    cls = "".join(part.capitalize() for part in name.split("_"))
    files = {
        root / "methods" / f"{name}.py": MODULE.format(name=name, cls=cls, title=cls),
        root / "configs" / "method" / f"{name}.yaml": CONFIG.format(name=name, title=cls),
        root / "tests" / "methods" / f"test_{name}.py": TEST.format(name=name),
    }
    taken = [str(p.relative_to(root)) for p in files if p.exists()]
    if taken:
        raise ValueError(f"method {name!r} already exists: {', '.join(taken)}")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return list(files)  # the registry finds methods/<name>.py by itself (methods/registry.py)
