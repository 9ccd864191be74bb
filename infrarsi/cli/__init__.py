"""The ``infrarsi`` command: campaign, init, report, bank and compare."""
