"""The run stage: the search, patch rounds, the evidence plan, verification and minimization."""
