"""Reports: read a finished sweep, bootstrap statistics, leaderboards, plots and the HTML report."""
