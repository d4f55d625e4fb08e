"""Reports: read a finished sweep, bootstrap statistics, leaderboards, plots and the HTML report.

Modules, each importing only those before it (``tests/test_report.py`` checks the order):
  bootstrap    interval statistics on (seeds x problems) score matrices; imports nothing of the harness
  power        variance components, detectable effects, seeds needed (``harness power``)
  verdicts     the papers' claims, their validation and the reproduction verdicts with Holm's correction
  evidence     reading a finished sweep (``Evidence``, failed runs, realised budget per checkpoint)
  reported     the papers' numbers (``configs/reported/<sweep>.yaml``)
  summary      the statistics per checkpoint, method, benchmark and metric: the rows of ``leaderboard.csv``
  tables       cell formatting and the overview, per-benchmark and per-run tables
  markdown     ``leaderboard.md`` and the notes both pages show
  html         ``report.html``
  plots        the figures
  leaderboard  ``write_leaderboard``, what ``harness report`` runs: reads, computes, writes every file
"""
