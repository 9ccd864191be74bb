"""The five stages of a campaign: init, doctor, run (search + verify), report, apply."""
