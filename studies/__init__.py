"""Simulation studies of the report's statistics (not speed or memory benchmarks): how well the leaderboard's
intervals cover with few seeds (``studies.interval_coverage``) and what the group-sequential seed design of
``harness extend-seeds`` holds and saves (``studies.sequential_design``). Each runs from the repository root as
``python -m studies.<name>`` and publishes like a benchmark (``bench.publish``): ``results/bench/<name>.json`` and its
section of results/bench/summary.md."""
