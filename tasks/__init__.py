"""Prefect tasks: thin wrappers that add retries and caching to the core stages."""
