"""A direct ``POST /generate`` (no bootstrap room: a request straight to one server, not the router's fan-out),
answered deterministically, as SGLang does with ``--enable-deterministic-inference``: the same model and input
give the same output, byte for byte, so a canary can compare a new server's answer with a recorded one.

``SGLANG_DEMO_GENERATE_FAIL`` makes it fail the ways broken PD serving does while ``/health`` says 200: an
HTTP 200 whose ``finish_reason`` is ``{"type": "error"}`` (smg#2382), or an HTTP 500 (sglang#33789).
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

MAX_NEW_TOKENS_CAP = 4096
DEFAULT_MAX_NEW_TOKENS = 16
# The demo model's vocabulary: short words, so an answer reads as text.
VOCAB = ("the", "cache", "moves", "over", "rdma", "to", "decode", "a", "room", "is", "done", "and",
         "prefill", "sends", "each", "chunk", "once", "token", "stays", "sticky")


class BadGenerate(ValueError):
    pass


def _max_new_tokens(body: dict[str, Any]) -> int:
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadGenerate("sampling_params must be an object")
    value = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadGenerate("sampling_params.max_new_tokens must be an int")
    return min(max(value, 1), MAX_NEW_TOKENS_CAP)


def tokens(model: str, prompt: str, max_new: int) -> list[str]:
    """The demo model's output: each token follows from the model, the prompt and the tokens before it, so it is
    deterministic, and different for a different prompt."""
    digest = hashlib.sha256(f"{model}\0{prompt}".encode()).digest()
    words = []
    for i in range(max_new):
        digest = hashlib.sha256(digest + i.to_bytes(4, "big")).digest()
        words.append(VOCAB[digest[0] % len(VOCAB)])
    return words


def answer(model: str, body: dict[str, Any], fail: str) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON body of a direct generation."""
    text = body.get("text")
    if not isinstance(text, str):
        raise BadGenerate("text (a string) is required")
    max_new = _max_new_tokens(body)
    rid = str(body.get("rid") or uuid.uuid4().hex)
    if fail == "500":
        return 500, {"error": {"message": "Internal server error: KV transfer to the decode side failed"}}
    prompt_tokens = max(1, len(text.split()))
    if fail == "error":
        return 200, {"text": "", "meta_info": {"id": rid, "prompt_tokens": prompt_tokens, "completion_tokens": 0,
                                               "finish_reason": {"type": "error", "message": "KV transfer failed"}}}
    return 200, {"text": "".join(" " + word for word in tokens(model, text, max_new)),
                 "meta_info": {"id": rid, "prompt_tokens": prompt_tokens, "completion_tokens": max_new,
                               "finish_reason": {"type": "length", "length": max_new}}}
