"""The serving API a storm and a canary speak: SGLang's native one, an OpenAI-compatible one (vLLM's, and SGLang's
own /v1 routes), or a request template for anything else.

A template is a path and a JSON body in which a string may hold the placeholders `{prompt}` and `{max_tokens}`: a
string that is exactly one placeholder becomes its value (the token count stays a number), one that holds a
placeholder among other text gets it spliced in. Any other `{name}` is refused when the file is loaded, since it
would otherwise reach the server as literal text.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag

PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\}")
FILLED = ("prompt", "max_tokens")


def _known_placeholders(value: Any) -> Any:
    """A body entry (checked one by one, so that an error points at its entry) naming only known placeholders."""
    unknown = sorted({name for text in _strings(value) for name in PLACEHOLDER.findall(text)} - set(FILLED))
    if unknown:
        raise ValueError(f"unknown placeholder {', '.join('{' + n + '}' for n in unknown)} "
                         f"(known: {', '.join('{' + n + '}' for n in FILLED)})")
    return value


class RequestTemplate(BaseModel):
    """A generation request spelled out: where it is POSTed and its JSON body."""

    model_config = ConfigDict(extra="forbid", frozen=True,  # config.models.Strict's (that module imports this one)
                              defer_build=True)

    path: str = Field(pattern=r"^/", description=(
        "The URL path the request is POSTed to (e.g. /v1/chat/completions), on the host's endpoint or server."))
    body: dict[str, Annotated[Any, AfterValidator(_known_placeholders)]] = Field(description=(
        "The JSON body; a string may hold {prompt} and {max_tokens} (alone: the value itself, a number for "
        "max_tokens). A storm adds stream: true."))


# The named APIs, as the templates (path, body) they stand for.
NAMED: dict[str, tuple[str, dict[str, Any]]] = {
    "sglang": ("/generate", {"text": "{prompt}", "sampling_params": {"max_new_tokens": "{max_tokens}"}}),
    "openai": ("/v1/completions", {"prompt": "{prompt}", "max_tokens": "{max_tokens}"}),
    "openai-chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "{prompt}"}],
                                             "max_tokens": "{max_tokens}"}),
}


def _kind(value: Any) -> str:
    return "name" if isinstance(value, str) else "template"


# A discriminated union: a mistake inside a template is reported there, not as "or must be 'sglang'".
Api = Annotated[
    Annotated[Literal["sglang", "openai", "openai-chat"], Tag("name")] | Annotated[RequestTemplate, Tag("template")],
    Discriminator(_kind),
]
API_HELP = ("sglang (POST /generate), openai (POST /v1/completions), openai-chat (POST /v1/chat/completions), or a "
            "template {path, body} whose strings may hold {prompt} and {max_tokens}")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [s for item in items for s in _strings(item)]


def _fill(value: Any, values: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        return {k: _fill(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, values) for v in value]
    if not isinstance(value, str):
        return value
    whole = PLACEHOLDER.fullmatch(value)
    if whole:
        return values[whole.group(1)]
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), value)


def request(api: str | RequestTemplate, prompt: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """The path and JSON body of one generation in this API."""
    path, body = NAMED[api] if isinstance(api, str) else (api.path, api.body)
    return path, _fill(body, {"prompt": prompt, "max_tokens": max_tokens})


def cancels_by_request(api: str | RequestTemplate) -> bool:
    """Whether the API has SGLang's /abort_request (an OpenAI server cancels only when the client goes away)."""
    return api == "sglang"
