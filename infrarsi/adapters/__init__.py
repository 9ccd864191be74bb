"""Adapters: the only modules that talk to outside systems (LLM endpoint, Ray, MLflow, git)."""
