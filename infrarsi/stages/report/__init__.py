"""The report stage: the report and summary, promotion's account, MFU."""
