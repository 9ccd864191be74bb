"""What a campaign tells whoever in this process listens (the CLI's progress bar): each
trial result as it is recorded, and each warning as it is raised. The flow hands
``publish`` to the runtime as its result callback, so a listener sees each recorded trial
once, in order, without reading the ledger; ``CampaignDir.add_warning`` calls ``warn``
for every new warning, so the console shows it while the campaign runs."""

from __future__ import annotations

import threading
from typing import Any, Callable

from infrarsi.core.trial import TrialResult

Listener = Callable[[TrialResult], None]
WarningListener = Callable[[str, str], None]  # (source, message)
_listeners: list[Any] = []
_warning_listeners: list[Any] = []
_lock = threading.Lock()


def _add(listeners: list[Any], listener: Any) -> Callable[[], None]:
    with _lock:
        listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in listeners:
                listeners.remove(listener)

    return unsubscribe


def subscribe(listener: Listener) -> Callable[[], None]:
    """Call ``listener`` with every trial recorded from now on; return the unsubscribe call."""
    return _add(_listeners, listener)


def subscribe_warnings(listener: WarningListener) -> Callable[[], None]:
    """Call ``listener(source, message)`` with every warning raised from now on."""
    return _add(_warning_listeners, listener)


def publish(result: TrialResult) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(result)


def warn(source: str, message: str) -> None:
    with _lock:
        listeners = list(_warning_listeners)
    for listener in listeners:
        listener(source, message)
