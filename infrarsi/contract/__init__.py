"""What may not change: the campaign spec as read (``spec_load``), the frozen contract, the checks
every trial passes, the loss contract and numerics classes, and the noise of a run's step time."""
