"""Uniform baseline: GRPO/DAPO/Dr.GRPO over every completion token.

Loss: L = sum_{i,t} w_{i,t} l_{i,t} / D with l the clipped surrogate, w and D from the baseline's aggregation
(DAPO token-mean by default; GRPO seq-mean-token-mean and Dr.GRPO seq-mean-token-sum-norm as switches, see
``methods.base.aggregation_weights``). Sources: DAPO arXiv 2503.14476, Dr.GRPO arXiv 2503.20783,
DeepSeekMath arXiv 2402.03300; verl core_algos.agg_loss. Deviations: none; the baseline's switches live in the
training config (``train.aggregation``, ``train.scale_rewards``) because every method shares them.
"""

from methods.base import Method
from methods.registry import register_method


@register_method("uniform")
class Uniform(Method):
    """All defaults of ``Method``: weights = aggregation weights of the completion mask, all rollouts kept."""
