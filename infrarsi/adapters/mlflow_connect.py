"""Reaching an MLflow tracking store: bounded HTTP retries and a quick reachability probe.

MLflow's own defaults retry an unreachable server for about four minutes per call (seven
retries with exponential backoff, 120 s timeout each). infrarsi calls MLflow from the
campaign's main thread, so every module that talks to MLflow calls ``bound_http_retries``
first: unless the user set them, ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` and
``MLFLOW_HTTP_REQUEST_TIMEOUT`` are lowered so a dead server costs seconds per call. And
before the first call, ``probe`` asks the server once with a short timeout, so a
campaign or ``infrarsi compare`` knows at start whether the store answers.
"""

from __future__ import annotations

import os
import sqlite3

import requests
import sqlalchemy.exc
from mlflow.exceptions import MlflowException

# What "the store is unreachable" looks like. Anything else (a TypeError, a bad argument)
# is a bug in the caller or here and must surface, not sit in a spool forever.
STORE_ERRORS = (MlflowException, OSError, requests.RequestException, sqlalchemy.exc.SQLAlchemyError, sqlite3.Error)

HTTP_MAX_RETRIES = 2
HTTP_TIMEOUT_S = 10
PROBE_TIMEOUT_S = 5.0


def bound_http_retries() -> None:
    """Lower MLflow's HTTP retries and timeout for this process, unless the user set them."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(HTTP_MAX_RETRIES))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(HTTP_TIMEOUT_S))


def probe(tracking_uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None if the tracking server at ``tracking_uri`` answers (any HTTP status: it is
    there), else what failed, in a few words. Stores that are not HTTP servers (SQLite, a
    file store) are local and not probed."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    try:
        requests.get(tracking_uri.rstrip("/") + "/health", timeout=timeout_s)
    except requests.RequestException as exc:
        return f"{type(exc).__name__}: {_reason(exc)}"
    return None


def describe(exc: BaseException) -> str:
    """``Type: first line of the message``, short enough for a one-line warning."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"


def _reason(exc: BaseException) -> str:
    """The innermost cause's message: requests wraps the socket error several times."""
    while exc.__context__ is not None and exc.__context__ is not exc:
        exc = exc.__context__
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
