"""The experience bank: every finished campaign, so the next one starts smarter.

Two stores behind one interface (``BankStore``): ``add``, ``forget``, ``list``, ``get`` and
``records``, and a ``location`` that names the store.

- ``infrarsi.bank.sqlite.Bank``, a SQLite file (the default: ``bank.sqlite`` in the infrarsi data folder,
  ``$INFRARSI_DATA_DIR``, else ``~/.local/share/infrarsi``). One row per campaign holds the
  hardware fingerprint and the workload's features (parameters, layers, sequence length,
  dense or MoE, tokens per step), the baseline and best configs, the proposer's posterior
  per-setting effects and prior revisions; every trial (config, outcome, step time, peak
  memory) and every patch decision (accepted or refused, with its measured effect) have
  their own tables.
- ``infrarsi.bank.mlflow.MlflowBank``, an MLflow tracking store a team shares: one
  run per campaign in the experiment ``infrarsi-bank``, the features as tags, the same
  record as a JSON artifact (``infrarsi.bank.records.record_to_json``).

``open_bank`` picks one from a setting (``--bank`` / ``INFRARSI_BANK``): ``off``, a file
path, or ``mlflow+`` followed by an MLflow tracking URI (``mlflow+http://host:5000``,
``mlflow+sqlite:///path/mlflow.db``). A store that cannot be reached raises
``BankUnavailableError``: at a campaign's start that stops it (``stages.probes``); when
the campaign ends, its record waits in ``infrarsi.bank.pending`` for the next campaign.

A new campaign reads it (``infrarsi.bank.similarity``: ``nearest_records``, then ``nearest``): past campaigns weighted by
how similar their hardware and workload are (``similarity``) give start configs (their
promoted config, then their fastest ok ones, projected onto the new knob space) and
per-setting priors (their posterior effects on step time, memory and trial cost, with the
spread widened as similarity falls). Campaigns are recorded at the end of the apply stage
(``infrarsi.bank.campaign.record_campaign``).
"""

from __future__ import annotations

import os
from pathlib import Path

from infrarsi.bank.records import BankStore
from infrarsi.bank.sqlite import Bank, default_path

OFF = "off"
MLFLOW_PREFIX = "mlflow+"  # "mlflow+<tracking URI>" selects the MLflow store


def bank_location(setting: str | Path | None) -> str | None:
    """The ``location`` of the store ``setting`` names (None: the bank is off), without
    opening it."""
    setting = setting if setting is not None else os.environ.get("INFRARSI_BANK")
    if setting is not None and str(setting).lower() == OFF:
        return None
    if setting is not None and str(setting).startswith(MLFLOW_PREFIX):
        return str(setting)
    return str(Path(setting if setting is not None else default_path()).expanduser())


def open_bank(setting: str | Path | None) -> BankStore | None:
    """The bank ``setting`` names: ``"off"`` (None), ``mlflow+<tracking URI>`` (the MLflow
    store), a SQLite path, or None for ``INFRARSI_BANK`` or else the default path. A store
    that cannot be reached raises ``BankUnavailableError``."""
    location = bank_location(setting)
    if location is None:
        return None
    if location.startswith(MLFLOW_PREFIX):
        from infrarsi.bank.mlflow import MlflowBank

        return MlflowBank(location.removeprefix(MLFLOW_PREFIX))
    return Bank(location)
