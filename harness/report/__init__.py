"""Reports: read a finished sweep, interval statistics, leaderboards, plots and the HTML report.

Modules, each importing only those before it (``tests/test_report.py`` checks the order):
  scores          per-problem score matrices (seeds x problems) and the crossed variance of their mean
  training_noise  the training noise of a paired difference pooled over a sweep's labels, and its moderation
  intervals       t intervals of means and paired differences, p-values, Holm's correction, verdicts and ranks
  bootstrap       the stratified bootstrap: IQM and P(X > Y) with percentile intervals
  outliers        outlying runs: a seed far below its label's others (a collapse), by a robust rule; the five
                  statistics modules import nothing else of the harness
  calibration     a preset's A/A calibration (``snakemake calibrate``): its training noise, read back by reports,
                  and the guard that refuses it where the sweep's own noise is significantly larger
  power           variance components, detectable effects, seeds needed (``harness power``)
  verdicts        the papers' claims, their validation and the reproduction verdicts with Holm's correction
  sequential      group-sequential stages of seeds: which claims are decided, which labels get more seeds
  evidence        reading a finished sweep (``Evidence``, failed runs, realised budget per checkpoint)
  reported        the papers' numbers (``configs/reported/<sweep>.yaml``)
  plan_power      ``harness plan``'s sizing before spending: the effect a sweep's seeds detect, from a preset's prior
  summary         the statistics per checkpoint, method, benchmark and metric: the rows of ``leaderboard.csv``
  tables          cell formatting and the overview, per-benchmark and per-run tables
  markdown        ``leaderboard.md`` and the notes both pages show
  html            ``report.html``
  plots           the figures
  leaderboard     ``write_leaderboard``, what ``harness report`` runs: reads, computes, writes every file
  across_sweeps   ``harness summarize``: one page (forest plot, claims, fidelity) across sweeps' leaderboard.json
"""
