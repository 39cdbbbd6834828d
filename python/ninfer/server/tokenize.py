"""POST /tokenize, POST /detokenize and GET /version (vLLM-compatible utility endpoints).

/tokenize's chat form goes through the same prompt path as /v1/chat/completions (template,
options, tools, literal control-token text), so its ids are the ones a chat request sends.
"""

from __future__ import annotations

from typing import Any

import msgspec

import ninfer
from ninfer.prompt.template_options import TemplateOptions
from ninfer.protocols.conversation import Conversation, render_conversation
from ninfer.protocols.openai_chat.lowering import check_model
from ninfer.protocols.openai_chat.messages import lower_messages
from ninfer.protocols.openai_chat.protocol import Message
from ninfer.protocols.openai_chat.tools import callable_tools, parse_tools
from ninfer.protocols.openai_completions.protocol import prompt_token_ids
from ninfer.protocols.served_model import ServedModel
from ninfer.server.config import AppConfig
from ninfer.server.errors import from_decode_error, invalid
from ninfer.server.http import HttpRequest


class TokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool | None = None  # None: as chat (a final assistant continues)
    return_token_strs: bool = False
    tools: list[Any] | None = None
    tool_choice: Any = None
    chat_template_kwargs: dict[str, Any] | None = None
    enable_thinking: bool | None = None
    preserve_thinking: bool | None = None
    reasoning_effort: str | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    tokens: list[int]
    model: str | None = None


def _decode(body: bytes, kind: type) -> Any:
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.MsgspecError as exc:
        raise from_decode_error(exc) from None


async def tokenize(request: HttpRequest, served: ServedModel, config: AppConfig) -> None:
    parsed: TokenizeRequest = _decode(
        await request.read_body(config.max_request_bytes), TokenizeRequest
    )
    if parsed.model is not None:
        check_model(parsed.model, served.public_id)
    if (parsed.prompt is None) == (parsed.messages is None):
        raise invalid(
            "give exactly one of `prompt` (text form) or `messages` (chat form)", "prompt"
        )
    if parsed.messages is not None:
        tools = parse_tools(parsed.tools)
        conversation = Conversation(
            messages=lower_messages(parsed.messages),
            options=TemplateOptions(
                enable_thinking=parsed.enable_thinking,
                preserve_thinking=parsed.preserve_thinking,
                reasoning_effort=parsed.reasoning_effort,
                kwargs=parsed.chat_template_kwargs,
                typed_fields={
                    n: n for n in ("enable_thinking", "preserve_thinking", "reasoning_effort")
                },
            ),
            tools=tools,
            callable_tools=callable_tools(parsed.tool_choice, tools),
            add_generation_prompt=parsed.add_generation_prompt,
            continue_final_message=parsed.continue_final_message is not False,
        )
        ids = render_conversation(served, conversation).ids
    elif parsed.add_special_tokens:
        ids = prompt_token_ids(parsed.prompt or "", served) if parsed.prompt else []
    else:
        ids = served.engine.tokenizer.encode(parsed.prompt or "", allow_special=True)
    body: dict[str, Any] = {"count": len(ids), "max_model_len": served.max_context, "tokens": ids}
    if parsed.return_token_strs:
        body["token_strs"] = [_token_str(served.engine.tokenizer, i) for i in ids]
    await request.send_json(200, body)


def _token_str(tokenizer: Any, token: int) -> str:
    id_to_token = getattr(tokenizer, "id_to_token", None)
    spelled = id_to_token(token) if callable(id_to_token) else None
    return spelled if isinstance(spelled, str) else tokenizer.decode([token])


async def detokenize(request: HttpRequest, served: ServedModel, config: AppConfig) -> None:
    parsed: DetokenizeRequest = _decode(
        await request.read_body(config.max_request_bytes), DetokenizeRequest
    )
    if parsed.model is not None:
        check_model(parsed.model, served.public_id)
    vocab = int(served.engine.model_info.get("n_vocab") or 0)
    for i, token in enumerate(parsed.tokens):
        if token < 0 or (vocab and token >= vocab):
            raise invalid(
                f"token id {token} is outside the vocabulary (size {vocab})", f"tokens[{i}]"
            )
    await request.send_json(200, {"prompt": served.engine.tokenizer.decode(parsed.tokens)})


async def version(request: HttpRequest) -> None:
    await request.send_json(200, {"version": ninfer.__version__})
