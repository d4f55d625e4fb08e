"""The names of a benchmark's scores, one owner for every module that writes or reads them: the eval job's
results.json (harness/evaluation/driver.py), the report's evidence, power and calibration, the trackers and the
studies.

    avg@k   mean accuracy of k sampled completions per problem, averaged over problems
    pass@j  unbiased pass@j from the same k samples (j = 1, 2, 4, ..., k)
    maj@k   the majority answer of the k samples is right
    greedy  one greedy completion per problem (results.json: ``greedy_accuracy``)

A claim (configs/reported/, the report's verdicts) names the sampled score generically, ``AVG_AT_K``, whatever k
the sweep evaluates with: ``avg_at(k)`` is the key it reads.
"""

from __future__ import annotations

AVG_AT_K = "avg@k"  # a claim's sampled metric, for any k (also a column of leaderboard_runs.csv)
PASS_AT_K, MAJ_AT_K = "pass@k", "maj@k"  # columns of leaderboard_runs.csv: j = k, any k
GREEDY = "greedy"  # a claim's greedy metric
GREEDY_ACCURACY = "greedy_accuracy"  # its key in results.json
SAMPLED_PREFIXES = ("avg@", "pass@", "maj@")


def avg_at(k: int) -> str:
    return f"avg@{k}"


def pass_at(j: int) -> str:
    return f"pass@{j}"


def maj_at(k: int) -> str:
    return f"maj@{k}"
