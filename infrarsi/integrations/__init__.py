"""Framework callbacks that speak the metrics protocol; each module imports its framework,
so import only the one you use: ``infrarsi.integrations.hf`` (Hugging Face ``Trainer``)
or ``infrarsi.integrations.lightning`` (Lightning ``Trainer``)."""
