"""What every part of infrarsi speaks: knobs, trials, the spec and the campaign's options, errors,
the objective, priors, the campaign folder and its ledger, and the glob rule for workload files."""
