"""Training: the TRL adapter (the only TRL import), method hooks, token statistics, the budget ledger, a run."""
