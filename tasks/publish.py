"""What a campaign shows in the Prefect UI: its flow run named after it, and its report
and summary table as artifacts."""

from __future__ import annotations

import re

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run

from infrarsi.core.workspace import CampaignDir
from infrarsi.stages.report.summary import summary_rows


def name_flow_run(name: str) -> None:
    """Rename the running flow run (a no-op outside one)."""
    if flow_run.id is None:
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, name=name)


def _key(campaign_id: str, what: str) -> str:  # artifact keys: lowercase letters, digits, dashes
    return re.sub(r"[^a-z0-9-]+", "-", f"infrarsi-{what}-{campaign_id}".lower())


@task(name="publish", cache_policy=NO_CACHE)
def publish_task(cdir: CampaignDir, summary: dict) -> None:
    cid = summary["campaign_id"]
    create_markdown_artifact(cdir.report_md.read_text(), key=_key(cid, "report"),
                             description=f"infrarsi report of campaign {cid} ({cdir.report_html})")
    create_table_artifact(summary_rows(summary), key=_key(cid, "summary"),
                          description=f"infrarsi summary of campaign {cid}")
