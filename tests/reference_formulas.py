"""The policy-loss formulas the tests check the harness against, written out once from their sources: PPO's clipped
surrogate (DAPO's clip-higher ranges) and verl's ``compute_policy_loss`` and legacy micro-batch means."""

import torch


def clipped_surrogate(logp, old_logp, advantages, eps_low=0.2, eps_high=0.28):
    """l = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = exp(logp - old_logp)."""
    ratio = torch.exp(logp - old_logp)
    return -torch.min(ratio * advantages, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * advantages)


def verl_policy_loss(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, clip_ratio_c):
    """verl's compute_policy_loss ("vanilla", token-mean), written out from its equations: ratio from the log-ratio
    clamped to +-20, pg_losses = max(-A r, -A clip(r)); for A < 0 min(that, -A c) (dual-clip); masked token mean.
    clip_ratio_c = inf turns the dual-clip off."""
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = (torch.gt(pg_losses2, pg_losses1).float() * response_mask).sum() / response_mask.sum()
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    lower = torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float()
    pg_clipfrac_lower = (lower * response_mask).sum() / response_mask.sum()
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    pg_loss = (pg_losses * response_mask).sum() / response_mask.sum()
    return pg_loss, pg_clipfrac, pg_clipfrac_lower


def verl_micro_batch_loss(per_token, mask, micro_batches, mini_batch_rows):
    """verl's dp_actor with use_dynamic_bsz: sum over micro-batches of masked_mean(l, mask) x len(mb) / mini-batch
    rows."""
    total = per_token.new_zeros(())
    for members in micro_batches:
        rows = torch.tensor(members)
        terms, m = per_token[rows], mask[rows]
        total = total + (terms * m).sum() / (m.sum() + 1e-8) * (len(members) / mini_batch_rows)
    return total
