"""The options of one campaign: one pydantic model that the CLI, the Prefect flow (its only
parameter, rendered as a form in the Prefect UI) and the campaign folder all share.

Validation happens when the model is built: on the command line before anything starts,
and for a deployment run when Prefect creates the flow run, so a bad value never leaves a
campaign folder or an MLflow run behind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infrarsi.core.errors import SpecError

if TYPE_CHECKING:
    from infrarsi.core.spec import CampaignSpec
    from infrarsi.core.workspace import CampaignDir

# The proposers' registry names (tests/test_options.py checks they match the registry).
ProposerName = Literal["engine", "gp", "greedy", "random", "tpe"]

# The overrides a campaign folder remembers (options.json), so --resume keeps them.
PERSISTED = ("proposer", "budget", "concurrency", "tracking_uri", "ray_address", "bank")


class CampaignOptions(BaseModel):
    """How to run one campaign. Every field is optional; unset ones fall back to the spec
    (proposer, budget), to what the campaign folder remembers (on resume), or to the
    machine's defaults (folders and the MLflow store under the infrarsi data folder)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: str | None = Field(
        default=None, max_length=4096,
        description="Campaign TOML: a path the worker can read, or a git spec URL#path@ref: the repository's "
                    "URL, then '#' and the file's path in it (default campaign.toml), then optionally '@' and a "
                    "branch or tag (e.g. https://host/team/job.git#tune/campaign.toml@v2). Empty: the built-in GPT "
                    "debug workload.")
    out: str | None = Field(
        default=None, max_length=4096,
        description="Folder that receives the campaign folder. Empty: 'campaigns' in the infrarsi data "
                    "folder ($INFRARSI_DATA_DIR, else $XDG_DATA_HOME/infrarsi, else ~/.local/share/infrarsi).")
    budget: int | None = Field(default=None, ge=1, le=10_000,
                               description="Search trials. Empty: the spec's budget.num_trials. The spec's "
                               "budget.max_trials caps the whole campaign: where it leaves the search fewer, the "
                               "search runs fewer and the campaign warns.")
    proposer: ProposerName | None = Field(default=None, description="Search strategy. Empty: the spec's.")
    campaign_id: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
        description="Name of the new campaign folder. Empty: <spec name>-<UTC time>-<random>.")
    resume: str | None = Field(
        default=None, max_length=4096,
        description="A campaign folder to finish instead of starting a new one; it keeps the options it "
                    "was started with unless given again here.")
    ray_address: str | None = Field(
        default=None, max_length=512,
        description="An existing Ray cluster: host:port of its head (as `ray start --head` prints it), "
                    "ray://host:port, or auto; probed at start. Token auth only with RAY_AUTH_MODE=token, as "
                    "Ray does. Empty: a private local Ray.")
    tracking_uri: str | None = Field(
        default=None, max_length=4096,
        description="MLflow tracking URI (a file store, SQLite or a server). Empty: $MLFLOW_TRACKING_URI, "
                    "else the machine's shared store, mlflow.db in the infrarsi data folder.")
    concurrency: int | None = Field(default=None, ge=1, le=4096,
                                    description="Parallel trial slots. Empty: the spec's, else the device slots.")
    fresh_doctor: bool = Field(default=False,
                               description="Measure the baseline again even when doctor's result is cached.")
    bank: str | None = Field(
        default=None, max_length=4096,
        description="Experience bank to read past campaigns from and record this one in: a SQLite file, "
                    "mlflow+<tracking URI> (an MLflow store, e.g. mlflow+http://host:5000), or 'off'. Empty: "
                    "$INFRARSI_BANK, else bank.sqlite in the infrarsi data folder.")

    @classmethod
    def parse(cls, data: dict[str, Any]) -> "CampaignOptions":
        """Build from untyped input; errors name the field, what was expected and what was found."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']} (got {e.get('input')!r})"
                                 for e in exc.errors())
            raise SpecError(f"invalid campaign options: {problems}") from None

    def persisted(self) -> dict[str, Any]:
        """The overrides set here that a campaign folder keeps for --resume."""
        return {k: getattr(self, k) for k in PERSISTED if getattr(self, k) is not None}

    def over(self, remembered: dict[str, Any]) -> "CampaignOptions":
        """These options, with ``remembered`` filling the persisted fields left unset."""
        fill = {k: v for k, v in remembered.items() if k in PERSISTED and getattr(self, k) is None}
        return self.model_copy(update=fill)

    def resumed(self, cdir: "CampaignDir") -> "CampaignOptions":
        """These options over what the campaign in ``cdir`` remembers: an option not given
        again is the one the campaign ran with."""
        return self.over(cdir.remembered_options())

    def search_budget(self, spec: "CampaignSpec") -> int:
        """Search trials: ``budget``, else the spec's ``budget.num_trials``."""
        return self.budget or spec.budget.num_trials
