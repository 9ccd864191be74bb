"""The experience bank: campaign records, their SQLite and MLflow stores, and how a new
campaign reads the nearest past ones."""
