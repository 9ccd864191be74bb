"""Prefect flows: they wire the stages, nothing more."""
