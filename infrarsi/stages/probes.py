"""The outside systems a campaign needs, asked once at its start with a short timeout.

A system the campaign cannot run without stops it in seconds, before any trial, with one
paragraph naming the address, what failed and the option that changes it
(``UnreachableError``): the Ray cluster (``--ray-address``) and the experience bank
(``--bank``). A system it can run without gives a warning instead: an LLM endpoint that
does not answer leaves the built-in priors (the spec's ``[llm]``); an MLflow server that
does not answer is probed by the tracker itself, which spools (``adapters.tracking``).
Opening the bank also delivers the records earlier campaigns left pending for it
(``bank.pending``).
"""

from __future__ import annotations

import logging

from infrarsi.core.spec import CampaignSpec

log = logging.getLogger(__name__)


def probe_outside_systems(spec: CampaignSpec, options: dict) -> list[tuple[str, str]]:
    """Probe what the campaign of ``spec`` with resolved ``options`` (ray_address, bank)
    uses; raise ``UnreachableError`` for one it needs, return ``(source, message)``
    warnings for the others."""
    from infrarsi.adapters.llm import probe_endpoint
    from infrarsi.adapters.ray_pool import probe_ray_address
    from infrarsi.bank.pending import deliver
    from infrarsi.bank.store import open_bank

    probe_ray_address(options.get("ray_address"))
    bank = open_bank(options.get("bank"))
    if bank is not None:
        delivered = deliver(bank)
        if delivered:
            log.info("delivered %d pending campaign record(s) to the bank %s: %s", len(delivered), bank.location,
                     delivered)
    warnings = []
    if spec.llm is not None:
        problem = probe_endpoint(spec.llm.base_url)
        if problem is not None:
            warnings.append(("llm", f"LLM endpoint {spec.llm.base_url} does not answer ({problem}); the campaign "
                                    "starts from the built-in priors unless it answers when asked (the spec's [llm])"))
    return warnings
