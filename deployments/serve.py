"""Serve the campaign flow without a work pool: ``python -m deployments.serve``.

Starts a long-running process that registers two deployments with the Prefect server in
``PREFECT_API_URL``: ``on-demand`` (UI-triggered; every flow parameter is a form field)
and ``weekly-retune`` (a cron schedule that re-measures the baseline).
"""

from __future__ import annotations

from prefect import serve

from flows.campaign import campaign


def deployments() -> list:
    return [
        campaign.to_deployment(name="on-demand", parameters={"out": "campaigns"}),
        campaign.to_deployment(name="weekly-retune", cron="0 3 * * 0",
                               parameters={"out": "campaigns", "fresh_doctor": True}),
    ]


if __name__ == "__main__":
    serve(*deployments())
