"""Training: the TRL boundary (harness.train.trl, the only TRL import), the actor (forwards, loss, update
schedule), method hooks, token statistics, the budget ledger, a run."""
