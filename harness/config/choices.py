"""The closed sets of names the configuration accepts, each defined once.

The configuration (``harness/config/schema.py``) is the lowest layer of ``harness/``, so the names it validates
against live here and the modules that implement them import them from here: a new name is added in this file and
implemented in its module, and ``tests/test_config.py`` fails until both agree.

- ``BUDGET_KINDS``: what ``train.budget.kind`` counts; each is spent in ``harness/train/budget.py``.
- ``GENERATION_COUNTING_BUDGET_KINDS``: the budget kinds whose spend includes every generated rollout, so they
  account for the groups DAPO's dynamic sampling discards (``steps`` counts optimizer steps only).
- ``PROMPT_TEMPLATES``: ``prompt_template``; each is rendered by ``harness/data/prompts.py``.
- ``SCORERS``: ``train.reward`` and ``eval.benchmarks.<name>.scorer``; each is ``harness/data/scoring.py``.
- ``KL_ESTIMATORS``: ``train.kl_estimator``; each is a function of ``harness/train/loss.py`` (``KL_ESTIMATORS``).
- ``HUB_PROBLEM_TRANSFORMS``: ``data.hub.problem_transform``; each is ``harness/data/hub.py`` (``PROBLEM_TRANSFORMS``).

The loss aggregations (``train.aggregation``) and the token statistics a method may read belong to the method
interface, ``methods/base.py`` (``AGGREGATIONS``, ``STATISTICS``): ``methods/`` never imports ``harness``.
"""

BUDGET_KINDS = ("flops", "accel_seconds", "tokens", "samples", "steps")
GENERATION_COUNTING_BUDGET_KINDS = ("flops", "accel_seconds", "tokens", "samples")
PROMPT_TEMPLATES = ("tiny", "qwen_boxed", "plain_8020", "chat")
SCORERS = ("numeric", "math_verify")
KL_ESTIMATORS = ("k1", "k3", "low_var_kl")
HUB_PROBLEM_TRANSFORMS = ("none", "strip_dapo_instruction")
