"""Performance benchmarks: speed and memory of the harness against plain TRL and of each method against the
uniform baseline, each script a module run from the repository root as ``python -m bench.<name>`` (bench/README.md).

Shared helpers, by concern: ``bench.stats`` (paired ratios and their intervals), ``bench.machine`` (the environment
record, how busy the machine was, a wall and CPU timer), ``bench.memory`` (resident-set probes of a process),
``bench.publish`` (the result files and their sections of results/bench/summary.md), ``bench.fixtures`` (the tiny and
smol sweeps the benchmarks train on, rollouts sampled as TRL samples them) and ``bench.trainer_variants`` (trainers
reset to the warm start and stepped in interleaved blocks). Nothing here asserts a threshold: targets are reported as
met or not met.
"""
