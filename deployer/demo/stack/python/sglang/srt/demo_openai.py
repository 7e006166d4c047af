"""The OpenAI-compatible routes a vLLM server (and SGLang's own /v1) serves: ``POST /v1/completions`` and
``POST /v1/chat/completions``, answered by the demo model (demo_generate.tokens), straight from this server.

Non-streaming: one JSON answer (``choices[0].text``, or ``choices[0].message.content`` for chat, and
``finish_reason: "length"``). With ``"stream": true``: one ``data: {...}`` SSE chunk per token
(``choices[0].text``, or ``choices[0].delta.content``), a last chunk with the finish_reason, then ``data: [DONE]``.
The API has no abort endpoint: a client that closes its connection mid-stream cancels the request, and the
server counts it as aborted (``/server_info``'s ``streams``). ``SGLANG_DEMO_GENERATE_FAIL`` fails a non-streaming
answer as it fails a direct ``/generate``.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

from sglang.srt.demo_generate import DEFAULT_MAX_NEW_TOKENS, MAX_NEW_TOKENS_CAP, BadGenerate, tokens
from sglang.srt.demo_http import JSONHandler, stream_tokens
from sglang.srt.demo_latency import Request

ROUTES = ("/v1/completions", "/v1/chat/completions")


class StreamStats:
    """How the streams this server answered itself ended (a direct /generate's and the OpenAI routes'): to the end,
    or cancelled by their client."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = {"completed": 0, "aborted": 0}

    def add(self, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] += 1


def _prompt(chat: bool, body: dict[str, Any]) -> str:
    if not chat:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise BadGenerate("prompt (a string) is required")
        return prompt
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or \
            not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        raise BadGenerate("messages (a list of {role, content}) is required")
    return "\n".join(m["content"] for m in messages)


def _max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_tokens", DEFAULT_MAX_NEW_TOKENS)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadGenerate("max_tokens must be an int")
    return min(max(value, 1), MAX_NEW_TOKENS_CAP)


def _choice(chat: bool, text: str, finish: str | None, streamed: bool) -> dict[str, Any]:
    if not chat:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    said = {"content": text} if streamed else {"role": "assistant", "content": text}
    return {"index": 0, "delta" if streamed else "message": said, "finish_reason": finish}


def serve(handler: JSONHandler, path: str, body: dict[str, Any], model: str, request: Request, fail: str,
          stats: StreamStats) -> None:
    """Answer one request on an OpenAI route, paced and timed by `request`."""
    chat = path == "/v1/chat/completions"
    try:
        prompt, max_new = _prompt(chat, body), _max_tokens(body)
    except BadGenerate as exc:
        handler.send_json(400, {"error": {"message": str(exc), "type": "BadRequestError", "code": 400}})
        return
    words = [" " + word for word in tokens(model, prompt, max_new)]
    head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}
    usage = {"prompt_tokens": max(1, len(prompt.split())), "completion_tokens": max_new,
             "total_tokens": max(1, len(prompt.split())) + max_new}
    if not body.get("stream"):
        request.answer_at_once(completed=not fail)
        if fail == "500":
            handler.send_json(500, {"error": {"message": "Internal server error", "type": "InternalServerError"}})
            return
        finish = "error" if fail == "error" else "length"
        text = "" if fail == "error" else "".join(words)
        handler.send_json(200, {**head, "object": "chat.completion" if chat else "text_completion",
                                "choices": [_choice(chat, text, finish, streamed=False)], "usage": usage})
        return
    kind = "chat.completion.chunk" if chat else "text_completion"

    def event(text: str, finish: str | None) -> bytes:
        chunk = {**head, "object": kind, "choices": [_choice(chat, text, finish, streamed=True)]}
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    ended = stream_tokens(handler, [event(word, None) for word in words], event("", "length"), request)
    stats.add("completed" if ended else "aborted")
