"""The campaign record: what the stages wrote to a campaign folder, read back the same way by
every reader (the report, the bank, the command line, the flow), below the stages that write it."""
