"""Evaluation: lm-eval over our task YAMLs, sample scoring, avg@k / pass@k / maj@k."""
