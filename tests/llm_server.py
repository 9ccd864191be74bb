"""A scripted OpenAI-compatible chat completions server for tests.

It speaks just enough of the protocol for the real ``openai`` client: ``POST
/v1/chat/completions`` returns a ``ChatCompletion`` whose message carries the scripted
content or refusal. Each test sets one ``Reply`` that answers every request until
changed (so a 500 answers the client's retries too), or queues several in ``queue``
(answered in order, then ``reply`` again), and reads back ``requests``: the JSON bodies
the client sent, in order. Replies can be slow (``delay_s``, then the answer), hang past
the client's timeout, be truncated (cut mid-answer, ``finish_reason = "length"``),
malformed (any text), refusing, an HTTP error, or a 200 whose body is not a chat
completion at all (``Reply.body``: a proxy's HTML page, some other API's JSON).

    with running_server() as server:
        server.reply = Reply.json({"effects": []})
        client = openai.OpenAI(base_url=server.base_url, api_key="EMPTY")
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response


@dataclass(frozen=True, kw_only=True)
class Reply:
    """What the server answers: ``content`` or ``refusal`` in a 200, an error ``status``,
    ``raw_body`` as the whole 200 response, or nothing for ``hang_s`` seconds (past the
    client's timeout)."""

    content: str | None = None
    refusal: str | None = None
    status: int = 200
    hang_s: float = 0.0
    delay_s: float = 0.0
    finish_reason: str = "stop"
    raw_body: str | None = None
    media_type: str = "application/json"

    @classmethod
    def json(cls, obj: Any) -> "Reply":
        return cls(content=json.dumps(obj))

    @classmethod
    def text(cls, text: str) -> "Reply":
        return cls(content=text)

    @classmethod
    def refused(cls, reason: str = "I can't help with that.") -> "Reply":
        return cls(refusal=reason)

    @classmethod
    def error(cls, status: int = 500) -> "Reply":
        return cls(status=status)

    @classmethod
    def body(cls, text: str, media_type: str = "application/json") -> "Reply":
        """A 200 whose whole body is ``text``: not a chat completion."""
        return cls(raw_body=text, media_type=media_type)

    @classmethod
    def hang(cls, seconds: float) -> "Reply":
        return cls(hang_s=seconds)

    @classmethod
    def slow(cls, seconds: float, obj: Any) -> "Reply":
        """A valid answer after ``seconds`` (inside the client's timeout)."""
        return cls(content=json.dumps(obj), delay_s=seconds)

    @classmethod
    def truncated(cls, obj: Any, keep: float = 0.5) -> "Reply":
        """The first ``keep`` share of a JSON answer, cut as a model out of tokens would."""
        text = json.dumps(obj)
        return cls(content=text[: int(len(text) * keep)], finish_reason="length")


class ScriptedLLMServer:
    def __init__(self) -> None:
        self.reply = Reply.json({})
        self.queue: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        self.port = 0
        self.app = self._build_app()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def reset(self, reply: Reply | None = None) -> None:
        self.reply = reply or Reply.json({})
        self.queue.clear()
        self.requests.clear()

    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Response:
            body = await request.json()
            self.requests.append(body)
            reply = self.queue.pop(0) if self.queue else self.reply
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            if reply.hang_s:
                await _hang(request, reply.hang_s)
            if reply.status != 200:
                error = {"message": "scripted server error", "type": "server_error", "code": None}
                return JSONResponse({"error": error}, status_code=reply.status)
            if reply.raw_body is not None:
                return Response(reply.raw_body, media_type=reply.media_type)
            return JSONResponse(_completion(body, reply, num=len(self.requests)))

        return app


async def _hang(request: Request, seconds: float) -> None:
    # Stop once the client gives up, so no handler outlives the test that started it.
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not await request.is_disconnected():
        await asyncio.sleep(0.02)


def _completion(body: dict[str, Any], reply: Reply, *, num: int) -> dict[str, Any]:
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
    completion_tokens = len((reply.content or reply.refusal or "").split())
    return {
        "id": f"chatcmpl-test-{num}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": reply.content, "refusal": reply.refusal},
            "finish_reason": reply.finish_reason,
            "logprobs": None,
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


@contextlib.contextmanager
def running_server() -> Iterator[ScriptedLLMServer]:
    """Serve a ``ScriptedLLMServer`` with uvicorn on a free 127.0.0.1 port in a thread."""
    server = ScriptedLLMServer()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server.port = sock.getsockname()[1]
    # A short graceful shutdown so a still-hanging handler does not hold up teardown.
    config = uvicorn.Config(server.app, log_level="warning", timeout_graceful_shutdown=1)
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the scripted LLM server did not start within 10 s")
        time.sleep(0.01)
    try:
        yield server
    finally:
        uv.should_exit = True
        thread.join(timeout=5)
        sock.close()
