"""DAPO's soft overlong punishment: a length term added to the correctness reward (``train.overlong``).

DAPO (Yu et al., arXiv 2503.14476, §3.4, Eq. 13), with L_max the maximum response length, L_cache the buffer
(punishment interval) at its end and |o| the response length in tokens:

    R_length(o) = 0                                    if |o| <= L_max - L_cache
                = ((L_max - L_cache) - |o|) / L_cache   if L_max - L_cache < |o| <= L_max
                = -1                                   if L_max < |o|

The official implementation (verl recipe/dapo, ``DAPORewardManager`` in verl/workers/reward_manager/dapo.py,
github.com/volcengine/verl @003364bc) scales it by ``overlong_buffer.penalty_factor`` and adds it to the score:

    expected_len = max_resp_len - overlong_buffer_len
    exceed_len = valid_response_length - expected_len
    overlong_reward = min(-exceed_len / overlong_buffer_len * overlong_penalty_factor, 0)
    reward = score + overlong_reward

where ``max_resp_len`` is the generation cap (``data.max_response_length``): the DAPO, 80/20 and KTAE scripts set
max_response_length = 20480 / 20480 / 3072 with the buffer 4096 / 4096 / 512 *inside* it, penalty factor 1.0.
``valid_response_length`` counts the response tokens up to and including EOS, as TRL's ``completion_ids`` do.
Here L_max = ``train.max_completion_length``, L_cache = ``train.overlong.buffer``, factor = ``train.overlong.penalty``.

Beyond L_max verl's ``min`` keeps falling linearly (below -factor) where the paper says -1; this module follows the
paper there (-factor). The two agree for every length generation can produce: TRL stops at max_completion_length.

The term is a second TRL reward function, so TRL logs it apart (``rewards/overlong/mean``, beside
``rewards/correct_<scorer>/mean``; ``reward`` is their sum) and the trainer's advantages use the sum of the reward
functions, as verl's advantage uses ``score + overlong_reward``. Methods that read ``RolloutBatch.rewards`` (KTAE's
correct/wrong split at R > 0) see the sum too, as in verl, where the reward tensor holds it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def overlong_reward(lengths: torch.Tensor, max_length: int, buffer: int, penalty: float) -> torch.Tensor:
    """Soft overlong punishment per rollout: ``lengths`` (B,) completion tokens -> (B,) float64 rewards in
    [-penalty, 0]. ``max_length`` = L_max, ``buffer`` = L_cache (0 < buffer < max_length), ``penalty`` >= 0."""
    if not 0 < buffer < max_length:
        raise ValueError(f"overlong buffer must lie in (0, max_length={max_length}), got {buffer}")
    if penalty < 0:
        raise ValueError(f"overlong penalty must be >= 0, got {penalty}")
    lengths = torch.as_tensor(lengths, dtype=torch.float64)
    expected = max_length - buffer  # the longest response that is not punished
    # min(-(|o| - (L_max - L_cache)) / L_cache * penalty, 0); "+ 0.0" turns the -0.0 at |o| = expected into 0.0
    ramp = torch.clamp(-(lengths - expected) / buffer * penalty, max=0.0) + 0.0
    # DAPO Eq. 13 beyond L_max: -1 (times the factor); unreachable when generation stops at L_max
    return torch.where(lengths > max_length, torch.full_like(lengths, -penalty), ramp)


def overlong_reward_functions(train) -> list[Callable[..., list[float]]]:
    """The TRL reward functions that ``train.overlong`` adds after the correctness reward: none when
    ``train.overlong.buffer`` is 0 (off), else one named ``overlong`` (TRL's metric ``rewards/overlong/mean``)."""
    config = train.overlong
    if config.buffer == 0:
        return []
    max_length, buffer, penalty = train.max_completion_length, config.buffer, config.penalty

    def overlong(prompts, completions, completion_ids, **kwargs) -> list[float]:
        lengths = torch.tensor([len(ids) for ids in completion_ids])
        return overlong_reward(lengths, max_length, buffer, penalty).tolist()

    return [overlong]
