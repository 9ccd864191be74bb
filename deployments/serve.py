"""Serve the campaign flow without a work pool: ``python -m deployments.serve``.

Starts a long-running process that registers two deployments with the Prefect server in
``PREFECT_API_URL``, named apart from ``prefect.yaml``'s (``served-on-demand`` and
``served-weekly-retune``) so serving never takes over or pauses the work pool's
deployments. The weekly schedule starts paused, as in ``prefect.yaml``.
"""

from __future__ import annotations

from prefect import serve
from prefect.schedules import Cron

from flows.campaign import campaign


def deployments() -> list:
    return [
        campaign.to_deployment(name="served-on-demand", concurrency_limit=1),
        campaign.to_deployment(name="served-weekly-retune", concurrency_limit=1,
                               schedule=Cron("0 3 * * 0", timezone="UTC", active=False),
                               parameters={"options": {"fresh_doctor": True}}),
    ]


if __name__ == "__main__":
    serve(*deployments(), limit=1)
