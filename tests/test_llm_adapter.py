"""The LLM adapter, driven by the real openai client against a scripted local server."""

from __future__ import annotations

import json
import logging
import math

import pytest

from infrarsi.adapters.llm import (
    CONFIDENT_LOG_STD,
    LLMClient,
    LLMEndpointError,
    LLMSettings,
    LLMUnavailableError,
    PatchProposal,
    confidence_to_log_std,
    patch_or_none,
    priors_or_fallback,
)
from infrarsi.core.errors import PatchError, SpecError
from infrarsi.core.knobs import Constraint, Knob, KnobSpace
from infrarsi.core.priors import UNINFORMED_LOG_STD, Priors, SettingPrior
from tests.llm_server import Reply, ScriptedLLMServer, running_server

SPACE = KnobSpace(
    knobs=(
        Knob(name="micro_batch", values=(1, 2, 4), description="sequences per device per step"),
        Knob(name="checkpointing", values=("none", "selective", "full")),
        Knob(name="compile", values=(False, True)),
    ),
    constraints=(Constraint("not (compile and checkpointing == 'selective')"),),
)
BASELINE = {"micro_batch": 2, "checkpointing": "none", "compile": False}
BUILTIN = Priors.of(
    [SettingPrior(knob="compile", value=True, log_time_mean=math.log(0.85), source="builtin"),
     SettingPrior(knob="micro_batch", value=4, log_time_mean=math.log(0.95), source="builtin")],
    source="builtin",
)
DESCRIPTIONS = {"workload_description": "GPT 124M, seq 1024", "hardware_description": "1x CPU"}


def effect(knob, value, time=1.0, memory=1.0, confidence=0.5, rationale="because"):
    return {"knob": knob, "value": value, "time_multiplier": time, "memory_multiplier": memory,
            "confidence": confidence, "rationale": rationale}


@pytest.fixture(scope="module")
def served():
    with running_server() as server:
        yield server


@pytest.fixture
def server(served: ScriptedLLMServer) -> ScriptedLLMServer:
    served.reset()
    return served


def settings_for(server, **overrides) -> LLMSettings:
    return LLMSettings(base_url=server.base_url, model="test-model", api_key_env="INFRARSI_TEST_LLM_KEY",
                       **{"timeout_s": 2.0, "max_retries": 2, **overrides})


def ask_priors(server, **overrides):
    return priors_or_fallback(settings_for(server, **overrides), SPACE, BASELINE, fallback=BUILTIN, **DESCRIPTIONS)


def test_valid_priors_are_parsed_and_converted_to_log_effects(server):
    server.reply = Reply.json({"effects": [
        effect("micro_batch", "4", time=0.8, memory=1.6, confidence=0.5, rationale="bigger matmuls"),
        effect("checkpointing", "full", time=1.3, memory=0.5, confidence=1.0),
        effect("compile", "true", time=0.9, memory=1.0, confidence=0.0),
    ]})
    priors = LLMClient(settings_for(server)).propose_priors(SPACE, BASELINE, **DESCRIPTIONS)

    assert priors.source == "llm:test-model"
    assert len(priors.settings) == 3
    mb4 = priors.get("micro_batch", 4)
    assert mb4.log_time_mean == pytest.approx(math.log(0.8))
    assert mb4.log_memory_mean == pytest.approx(math.log(1.6))
    assert mb4.log_time_std == pytest.approx((math.log(2.0) + math.log(1.1)) / 2)
    assert (mb4.source, mb4.rationale) == ("llm:test-model", "bigger matmuls")
    full = priors.get("checkpointing", "full")
    assert full.log_memory_mean == pytest.approx(math.log(0.5))
    assert full.log_memory_std == pytest.approx(CONFIDENT_LOG_STD)
    compiled = priors.get("compile", True)
    assert compiled.log_time_mean == pytest.approx(math.log(0.9))
    assert compiled.log_time_std == pytest.approx(UNINFORMED_LOG_STD)

    (request,) = server.requests
    assert request["model"] == "test-model"
    assert request["response_format"]["type"] == "json_schema"
    assert request["response_format"]["json_schema"]["name"] == "PriorsAnswer"
    assert request["response_format"]["json_schema"]["strict"] is True
    prompt = request["messages"][-1]["content"]
    for name in SPACE.names:
        assert name in prompt
    assert "micro_batch = 4" in prompt and "micro_batch = 2" not in prompt  # baseline not asked
    assert "not (compile and checkpointing == 'selective')" in prompt


def test_llm_priors_are_merged_over_the_fallback(server):
    server.reply = Reply.json({"effects": [effect("micro_batch", "4", time=0.8)]})
    priors, warnings = ask_priors(server)
    assert warnings == []
    assert priors.source == "llm:test-model+builtin"
    assert priors.get("micro_batch", 4).log_time_mean == pytest.approx(math.log(0.8))
    assert priors.get("compile", True).source == "builtin"


def test_unknown_knobs_values_and_bad_numbers_are_dropped_with_warnings(server, caplog):
    server.reply = Reply.json({"effects": [
        effect("micro_batch", "1", time=1.4, memory=0.7),
        effect("tensor_parallel", "2", time=0.5),
        effect("micro_batch", "8", time=0.7),
        effect("checkpointing", "full", time=0.0),
        effect("compile", "true", time=0.9, confidence=1.5),
        effect("checkpointing", "none", time=1.0),  # the baseline's own setting: ignored
    ]})
    with caplog.at_level(logging.WARNING, logger="infrarsi.adapters.llm"):
        priors, warnings = ask_priors(server)

    assert priors.get("micro_batch", 1).log_time_mean == pytest.approx(math.log(1.4))
    assert priors.get("compile", True).source == "builtin"
    assert ("checkpointing", "none") not in priors.settings
    assert [w.split(":")[0] for w in warnings] == [
        "LLM prior tensor_parallel='2' dropped", "LLM prior micro_batch='8' dropped",
        "LLM prior checkpointing='full' dropped", "LLM prior compile='true' dropped",
    ]
    assert "unknown knob 'tensor_parallel'" in warnings[0]
    assert "must be finite and > 0" in warnings[2]
    assert "confidence must be in [0, 1]" in warnings[3]
    assert sum("dropped" in r.getMessage() for r in caplog.records) == 4


@pytest.mark.parametrize("reply", [Reply.text('{"effects": [{"knob": "micro_batch", '),
                                   Reply.json({"settings": []})], ids=["bad_json", "wrong_schema"])
def test_malformed_answer_falls_back_and_keeps_the_raw_answer(server, reply, tmp_path, caplog):
    server.reply = reply
    with caplog.at_level(logging.WARNING, logger="infrarsi.adapters.llm"):
        priors, (warning,) = priors_or_fallback(settings_for(server), SPACE, BASELINE, fallback=BUILTIN,
                                                log_dir=tmp_path / "llm", **DESCRIPTIONS)
    assert priors is BUILTIN
    assert "malformed answer (ValidationError" in warning and "using the builtin priors" in warning
    assert any(reply.content in r.getMessage() for r in caplog.records)
    (saved,) = (tmp_path / "llm").glob("llm-priors-*.json")
    record = json.loads(saved.read_text())
    assert json.loads(record["raw_answer"])["choices"][0]["message"]["content"] == reply.content
    assert "micro_batch" in record["messages"][-1]["content"]
    assert record["problem"] and record["model"] == "test-model"


@pytest.mark.fault
@pytest.mark.parametrize("body,media_type", [
    ('{"object": "list", "data": []}', "application/json"),  # another API's answer
    ("<html><body>Sign in to the proxy</body></html>", "text/html"),
    ('{"choices": []}', "application/json"),
    ("[1, 2]", "application/json"),
], ids=["other_api", "html", "no_choices", "not_an_object"])
def test_a_200_that_is_not_a_chat_completion_falls_back(server, body, media_type, tmp_path):
    server.reply = Reply.body(body, media_type)
    priors, (warning,) = priors_or_fallback(settings_for(server), SPACE, BASELINE, fallback=BUILTIN,
                                            log_dir=tmp_path / "llm", **DESCRIPTIONS)
    assert priors is BUILTIN
    assert "the answer is not a chat completion" in warning and "base_url" in warning
    assert "using the builtin priors" in warning
    (saved,) = (tmp_path / "llm").glob("llm-priors-*.json")
    assert json.loads(saved.read_text())["raw_answer"] == body  # the body as it came, for the user to see
    server.reset(Reply.body(body, media_type))
    assert patch_or_none(settings_for(server), "task", {"m.py": "x = 1\n"}, ["*.py"])[0] is None


def test_refusal_falls_back(server):
    server.reply = Reply.refused("I cannot estimate that.")
    priors, (warning,) = ask_priors(server)
    assert priors is BUILTIN
    assert "refused (I cannot estimate that.)" in warning


def test_server_error_falls_back_after_the_client_retries(server):
    server.reply = Reply.error(500)
    priors, (warning,) = ask_priors(server, max_retries=2)
    assert priors is BUILTIN
    assert "InternalServerError" in warning
    assert len(server.requests) == 3


def test_timeout_falls_back(server):
    server.reply = Reply.hang(5.0)
    priors, (warning,) = ask_priors(server, timeout_s=0.3, max_retries=1)
    assert priors is BUILTIN
    assert "APITimeoutError" in warning
    assert len(server.requests) == 2


def test_no_endpoint_uses_the_fallback_silently(server, caplog):
    with caplog.at_level(logging.DEBUG, logger="infrarsi.adapters.llm"):
        assert priors_or_fallback(None, SPACE, BASELINE, fallback=BUILTIN, **DESCRIPTIONS) == (BUILTIN, [])
    assert caplog.records == [] and server.requests == []


def test_a_rejected_request_is_a_configuration_error(server):
    server.reply = Reply.error(404)
    with pytest.raises(LLMEndpointError, match="HTTP 404.*check base_url, model and the API key"):
        ask_priors(server)
    assert len(server.requests) == 1  # 4xx is not retried


def test_programmer_errors_raise_before_any_request(server):
    with pytest.raises(SpecError, match="baseline: missing value for knob"):
        priors_or_fallback(settings_for(server), SPACE, {"micro_batch": 2}, fallback=BUILTIN, **DESCRIPTIONS)
    with pytest.raises(PatchError, match="at least one file"):
        LLMClient(settings_for(server)).propose_patch("faster", {}, ["model.py"])
    with pytest.raises(SpecError, match="llm.timeout_s"):
        settings_for(server, timeout_s=0)
    assert server.requests == []


def test_api_key_comes_from_the_named_variable_or_is_a_placeholder(monkeypatch):
    settings = LLMSettings(base_url="http://127.0.0.1:1/v1", model="m", api_key_env="INFRARSI_TEST_LLM_KEY")
    monkeypatch.delenv("INFRARSI_TEST_LLM_KEY", raising=False)
    assert settings.api_key == "EMPTY"
    monkeypatch.setenv("INFRARSI_TEST_LLM_KEY", "sk-local")
    assert settings.api_key == "sk-local"


def test_confidence_maps_linearly_between_uninformed_and_confident_std():
    assert confidence_to_log_std(0.0) == pytest.approx(math.log(2.0))
    assert confidence_to_log_std(1.0) == pytest.approx(math.log(1.1))
    assert confidence_to_log_std(0.25) == pytest.approx(0.75 * math.log(2.0) + 0.25 * math.log(1.1))


PATCH = {
    "title": "Fuse AdamW", "rationale": "one kernel launch per step instead of one per tensor",
    "unified_diff": "--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-opt = AdamW(p)\n+opt = AdamW(p, fused=True)\n",
    "files_touched": ["train.py"], "expected_time_effect": 0.95, "expected_memory_effect": 1.0,
    "preconditions": ["parameters live on a CUDA device"],
}


def test_patch_proposal_is_parsed(server):
    server.reply = Reply.json(PATCH)
    files = {"train.py": "opt = AdamW(p)\n", "model.py": "class GPT: ...\n"}
    proposal = LLMClient(settings_for(server)).propose_patch("make the optimizer step faster", files, ["train.py"])

    assert proposal == PatchProposal(**PATCH)
    (request,) = server.requests
    assert request["response_format"]["json_schema"]["name"] == "PatchProposal"
    prompt = request["messages"][-1]["content"]
    assert "make the optimizer step faster" in prompt and "--- model.py" in prompt and "train.py" in prompt


def test_patch_refusal_or_bad_effect_gives_no_proposal(server):
    server.reply = Reply.json({**PATCH, "expected_time_effect": -1})
    proposal, (warning,) = patch_or_none(settings_for(server), "faster", {"train.py": ""}, ["train.py"])
    assert proposal is None and "malformed answer" in warning
    assert patch_or_none(None, "faster", {"train.py": ""}, ["train.py"]) == (None, [])


def test_a_slow_answer_inside_the_timeout_is_used_and_a_truncated_one_is_malformed(server):
    answer = {"effects": [{"knob": "micro_batch", "value": "4", "time_multiplier": 0.8, "memory_multiplier": 1.5,
                           "confidence": 0.5, "rationale": "bigger kernels"}]}
    settings = LLMSettings(base_url=server.base_url, model="m", timeout_s=5.0, max_retries=0)
    server.reset(Reply.slow(0.5, answer))
    client = LLMClient(settings)
    priors = client.propose_priors(SPACE, BASELINE, workload_description="w", hardware_description="h")
    assert priors.get("micro_batch", 4).log_time_mean == pytest.approx(math.log(0.8))
    server.reset(Reply.truncated(answer))
    with pytest.raises(LLMUnavailableError, match="malformed answer"):
        client.propose_priors(SPACE, BASELINE, workload_description="w", hardware_description="h")
