"""The one module that talks to an LLM: knob priors and code patch proposals from any
OpenAI-compatible endpoint (OpenAI, vLLM, SGLang, a llama.cpp server, ...). The run stage
asks for priors once and, through ``infrarsi.patches.sources``, for patches after doctor and
when the search stalls; every patch answer goes through the patch gate.

Both questions use structured output (``chat.completions.parse`` with a pydantic
``response_format``), so the answer arrives as a validated object or not at all.

Failure policy: an LLM is advice, never a dependency.

- No endpoint configured: ``priors_or_fallback`` returns the built-in priors, silently.
- No usable answer (malformed JSON or schema, a refusal, a 200 whose body is not a chat
  completion at all, a timeout, a connection error or a 5xx after the client's own
  retries): ``LLMUnavailableError`` from ``LLMClient``;
  ``priors_or_fallback`` / ``patch_or_none`` turn it into the fallback plus a warning.
  The raw answer is logged, and written to ``log_dir`` (every exchange, as JSON) if given.
- The endpoint rejects the request (bad key, unknown model, 4xx): ``LLMEndpointError``,
  raised, because only the user can fix the configuration.
- Programmer errors (a baseline outside the knob space, no files to patch) raise
  ``SpecError`` / ``PatchError`` before any request is sent.
"""

from __future__ import annotations

import json
import logging
import math
import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from infrarsi.adapters.llm_prompts import patch_messages, priors_messages, render_value
from infrarsi.core.errors import InfrarsiError, PatchError, SpecError
from infrarsi.core.knobs import Knob, KnobSpace, Value
from infrarsi.core.priors import UNINFORMED_LOG_STD, Priors, SettingPrior

__all__ = [
    "LLMSettings", "LLMClient", "PatchProposal", "LLMUnavailableError", "LLMEndpointError",
    "confidence_to_log_std", "priors_or_fallback", "patch_or_none", "probe_endpoint",
]

log = logging.getLogger(__name__)

# Even a fully confident LLM claim keeps +-20% at two standard deviations: live trials,
# not the LLM, should decide what a setting is worth.
CONFIDENT_LOG_STD = math.log(1.1)
_LOGGED_RAW_CHARS = 4000

AnswerT = TypeVar("AnswerT", bound=BaseModel)


class LLMUnavailableError(InfrarsiError):
    """The LLM gave no usable answer; fall back to built-in priors (or no patch)."""


class LLMEndpointError(InfrarsiError):
    """The LLM endpoint rejected the request; check base_url, model and the API key."""


@dataclass(frozen=True, kw_only=True)
class LLMSettings:
    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"  # name of the variable holding the key, not the key
    timeout_s: float = 60.0
    max_retries: int = 2

    def __post_init__(self) -> None:
        for name in ("base_url", "model", "api_key_env"):
            if not getattr(self, name):
                raise SpecError(f"llm.{name}: expected a non-empty string, got {getattr(self, name)!r}")
        if not self.timeout_s > 0:
            raise SpecError(f"llm.timeout_s: expected a number of seconds > 0, got {self.timeout_s!r}")
        if self.max_retries < 0:
            raise SpecError(f"llm.max_retries: expected an integer >= 0, got {self.max_retries!r}")

    @property
    def api_key(self) -> str:
        # A local server accepts any key, but the client refuses to start without one.
        return os.environ.get(self.api_key_env) or "EMPTY"


class SettingEffect(BaseModel):
    knob: str = Field(description="knob name, exactly as listed")
    value: str = Field(description="one of the knob's values, exactly as listed")
    time_multiplier: float = Field(description="step time with this setting / with the baseline's setting; > 0")
    memory_multiplier: float = Field(description="peak memory with this setting / with the baseline's; > 0")
    confidence: float = Field(description="0 = a guess, 1 = certain")
    rationale: str = Field(description="one sentence: why")


class PriorsAnswer(BaseModel):
    effects: list[SettingEffect]


class PatchProposal(BaseModel):
    """A code patch proposed by the LLM; the patch gate checks scope and applies it."""

    model_config = ConfigDict(frozen=True)

    title: str
    rationale: str
    unified_diff: str = Field(description="a unified diff that `git apply -p1` accepts in the folder of the files "
                              "shown (paths as shown, with a/ and b/ prefixes)")
    files_touched: list[str]
    expected_time_effect: float = Field(gt=0, description="step time after / before; 0.9 = 10% faster")
    expected_memory_effect: float = Field(gt=0, description="peak memory after / before")
    preconditions: list[str] = Field(description="what must hold for the patch to be correct")


def confidence_to_log_std(confidence: float) -> float:
    """Confidence 0 gives the uninformed std (log 2), 1 gives ``CONFIDENT_LOG_STD``
    (log 1.1); linear in between."""
    return (1 - confidence) * UNINFORMED_LOG_STD + confidence * CONFIDENT_LOG_STD


class LLMClient:
    """An ``openai.OpenAI`` client bound to one endpoint and model."""

    def __init__(self, settings: LLMSettings, *, log_dir: Path | str | None = None) -> None:
        openai = _import_openai()
        self.settings = settings
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self._client = openai.OpenAI(
            base_url=settings.base_url, api_key=settings.api_key,
            timeout=settings.timeout_s, max_retries=settings.max_retries,
        )

    def propose_priors(self, space: KnobSpace, baseline: Mapping[str, Value], *,
                       workload_description: str, hardware_description: str) -> Priors:
        """Priors for every non-baseline knob setting the LLM answered for."""
        priors, _ = self.priors_with_warnings(space, baseline, workload_description=workload_description,
                                              hardware_description=hardware_description)
        return priors

    def priors_with_warnings(self, space: KnobSpace, baseline: Mapping[str, Value], *,
                             workload_description: str, hardware_description: str) -> tuple[Priors, list[str]]:
        """``propose_priors`` plus the warnings about answer entries that were dropped."""
        baseline = space.validate(baseline, what="baseline")
        messages = priors_messages(space, baseline, workload_description, hardware_description)
        answer = self._ask("priors", messages, PriorsAnswer)
        source = f"llm:{self.settings.model}"
        priors, warnings = _to_setting_priors(answer, space, baseline, source)
        for warning in warnings:
            log.warning("%s", warning)
        return Priors.of(priors, source), warnings

    def propose_patch(self, task_description: str, files: Mapping[str, str],
                      editable_scope: Sequence[str]) -> PatchProposal:
        """One patch proposal for ``files`` (path -> content), limited to ``editable_scope``."""
        if not files:
            raise PatchError("propose_patch: expected at least one file (path -> content) to show the LLM, got none")
        if not editable_scope:
            raise PatchError("propose_patch: expected a non-empty editable scope (path globs), got none")
        return self._ask("patch", patch_messages(task_description, files, editable_scope), PatchProposal)

    def _ask(self, kind: str, messages: list[dict[str, str]], answer_type: type[AnswerT]) -> AnswerT:
        openai = _import_openai()
        malformed = (pydantic.ValidationError, json.JSONDecodeError,
                     openai.LengthFinishReasonError, openai.ContentFilterFinishReasonError)
        transient = (openai.APITimeoutError, openai.APIConnectionError,
                     openai.InternalServerError, openai.RateLimitError)
        raw_answer: str | None = None
        try:
            # with_raw_response keeps the body, so a malformed answer can still be saved.
            response = self._client.chat.completions.with_raw_response.parse(
                model=self.settings.model, messages=messages, response_format=answer_type,
            )
            raw_answer = response.text
            _require_chat_completion(raw_answer)
            message = response.parse().choices[0].message
        except _NotAChatCompletion as exc:
            problem = (f"the answer is not a chat completion ({exc}); check that base_url is the "
                       "OpenAI-compatible API (it usually ends in /v1)")
        except malformed as exc:
            problem = f"malformed answer ({type(exc).__name__}: {_first_line(exc)})"
        except transient as exc:
            problem = f"no answer after {self.settings.max_retries} retries ({type(exc).__name__}: {exc})"
            raw_answer = _error_body(exc)
        except openai.APIStatusError as exc:
            problem = f"request rejected with HTTP {exc.status_code} ({_first_line(exc)})"
            self._record(kind, messages, _error_body(exc), problem)
            raise LLMEndpointError(
                f"LLM {self.settings.model} at {self.settings.base_url}: {problem}; check base_url, "
                f"model and the API key in ${self.settings.api_key_env}"
            ) from exc
        else:
            if message.parsed is not None and not message.refusal:
                self._record(kind, messages, raw_answer, None)
                return message.parsed
            problem = f"refused ({message.refusal})" if message.refusal else "empty answer"
        warning = f"LLM {self.settings.model} at {self.settings.base_url}: {kind}: {problem}"
        self._record(kind, messages, raw_answer, warning)
        raise LLMUnavailableError(warning)

    def _record(self, kind: str, messages: list[dict[str, str]], raw_answer: str | None,
                problem: str | None) -> None:
        """Log a failed exchange with its raw answer; save every exchange under ``log_dir``."""
        if problem is not None:
            log.warning("%s; raw answer: %s", problem, _answer_text(raw_answer)[:_LOGGED_RAW_CHARS])
        if self.log_dir is None:
            return
        now = datetime.now(timezone.utc)
        record = {
            "kind": kind, "model": self.settings.model, "base_url": self.settings.base_url,
            "time_utc": now.isoformat(), "messages": messages, "raw_answer": raw_answer, "problem": problem,
        }
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"llm-{kind}-{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}.json"
        path.write_text(json.dumps(record, indent=2))


def priors_or_fallback(settings: LLMSettings | None, space: KnobSpace, baseline: Mapping[str, Value], *,
                       workload_description: str, hardware_description: str, fallback: Priors,
                       log_dir: Path | str | None = None) -> tuple[Priors, list[str]]:
    """The priors to use and the warnings to report: the LLM's priors over ``fallback``
    (which fills the settings the LLM skipped), or ``fallback`` alone when no endpoint is
    configured (no warning) or the LLM gave no usable answer (a warning)."""
    space.validate(baseline, what="baseline")
    if settings is None:
        return fallback, []
    try:
        priors, warnings = LLMClient(settings, log_dir=log_dir).priors_with_warnings(
            space, baseline, workload_description=workload_description,
            hardware_description=hardware_description,
        )
    except LLMUnavailableError as exc:
        return fallback, [f"{exc}; using the {fallback.source} priors instead"]
    return priors.merged_over(fallback), warnings


def patch_or_none(settings: LLMSettings | None, task_description: str, files: Mapping[str, str],
                  editable_scope: Sequence[str], *,
                  log_dir: Path | str | None = None) -> tuple[PatchProposal | None, list[str]]:
    """An LLM patch proposal, or None (with a warning if an endpoint was configured)."""
    if settings is None:
        return None, []
    try:
        return LLMClient(settings, log_dir=log_dir).propose_patch(task_description, files, editable_scope), []
    except LLMUnavailableError as exc:
        return None, [f"{exc}; no LLM patch this round"]


def probe_endpoint(base_url: str, timeout_s: float = 5.0) -> str | None:
    """None if something accepts a connection at ``base_url``'s host and port within
    ``timeout_s``, else what failed. Only reachability: whether it answers as a chat
    model is known when it is asked."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(base_url)
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
        socket.create_connection((url.hostname or "", port), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


class _NotAChatCompletion(ValueError):
    """A 200 answer whose body is not a chat completion (a proxy's page, another API)."""


def _require_chat_completion(body: str) -> None:
    """Raise ``_NotAChatCompletion`` unless ``body`` is a chat completion with a choice."""
    from openai.types.chat import ChatCompletion

    try:
        completion = ChatCompletion.model_validate_json(body)
    except pydantic.ValidationError as exc:
        raise _NotAChatCompletion(f"{exc.error_count()} field(s) wrong, first {_first_error(exc)}; "
                                  f"body begins {body[:80]!r}") from None
    if not completion.choices:
        raise _NotAChatCompletion("it holds no choices")


def _first_error(exc: pydantic.ValidationError) -> str:
    first = exc.errors()[0]
    return f"{'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']}"


def _import_openai() -> Any:
    try:
        import openai
    except ImportError:
        raise InfrarsiError("the LLM adapter needs the openai client: pip install 'openai>=3.57'") from None
    return openai


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


def _answer_text(raw_body: str | None) -> str:
    """The assistant's message from a raw response body, or the body itself."""
    try:
        message = json.loads(raw_body or "")["choices"][0]["message"]
        return str(message.get("content") or message.get("refusal"))
    except (ValueError, LookupError, TypeError, AttributeError):
        return raw_body or ""


def _error_body(exc: Exception) -> str | None:
    response = getattr(exc, "response", None)  # status errors carry one; timeouts do not
    return response.text if response is not None else None


# --- priors: the answer ----------------------------------------------------------------

def _match_value(knob: Knob, answer: str) -> tuple[bool, Value | None]:
    text = answer.strip().strip("'\"")
    for value in knob.values:
        if text in (render_value(value), str(value)):
            return True, value
    for value in knob.values:  # "0.50" for 0.5, "4.0" for 4
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                if float(text) == value:
                    return True, value
            except ValueError:
                break
    return False, None


def _check_effect(effect: SettingEffect, space: KnobSpace) -> tuple[Value | None, str | None]:
    """The knob value an answer entry is about, or why the entry is dropped."""
    if effect.knob not in space.names:
        return None, f"unknown knob {effect.knob!r}; known knobs are {space.names}"
    knob = space.knob(effect.knob)
    found, value = _match_value(knob, effect.value)
    if not found:
        return None, f"value {effect.value!r} is not in the domain of {knob.name!r} {list(knob.values)}"
    multipliers = (effect.time_multiplier, effect.memory_multiplier)
    if not all(math.isfinite(m) and m > 0 for m in multipliers):
        return None, f"multipliers must be finite and > 0, got time {multipliers[0]}, memory {multipliers[1]}"
    if not 0 <= effect.confidence <= 1:
        return None, f"confidence must be in [0, 1], got {effect.confidence}"
    return value, None


def _to_setting_priors(answer: PriorsAnswer, space: KnobSpace, baseline: Mapping[str, Value],
                       source: str) -> tuple[list[SettingPrior], list[str]]:
    priors: dict[tuple[str, Value], SettingPrior] = {}
    warnings = []
    for effect in answer.effects:
        value, problem = _check_effect(effect, space)
        if problem is None and (effect.knob, value) in priors:
            problem = "given more than once; kept the first"
        if problem is not None:
            warnings.append(f"LLM prior {effect.knob}={effect.value!r} dropped: {problem}")
            continue
        if value == baseline[effect.knob]:
            continue  # the reference setting: its effect is 0 by definition
        log_std = confidence_to_log_std(effect.confidence)
        priors[(effect.knob, value)] = SettingPrior(
            knob=effect.knob, value=value,
            log_time_mean=math.log(effect.time_multiplier), log_time_std=log_std,
            log_memory_mean=math.log(effect.memory_multiplier), log_memory_std=log_std,
            source=source, rationale=effect.rationale,
        )
    return list(priors.values()), warnings
