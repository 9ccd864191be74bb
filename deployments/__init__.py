"""Deployment definitions of the campaign flow (see also prefect.yaml at the top level)."""
