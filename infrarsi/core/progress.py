"""Trial results as they are recorded, for whoever in this process wants them (the CLI's
progress bar). The flow hands ``publish`` to the runtime as its result callback, so a
listener sees each recorded trial once, in order, without reading the ledger."""

from __future__ import annotations

import threading
from typing import Callable

from infrarsi.core.trial import TrialResult

Listener = Callable[[TrialResult], None]
_listeners: list[Listener] = []
_lock = threading.Lock()


def subscribe(listener: Listener) -> Callable[[], None]:
    """Call ``listener`` with every trial recorded from now on; return the unsubscribe call."""
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


def publish(result: TrialResult) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(result)
