"""Chat Completions' output and tool constraints -> the shared constraint lowering."""

from __future__ import annotations

from typing import Any

from ninfer.engine_types import GenerationRequest
from ninfer.protocols.constraints import (
    GrammarSpec,
    OutputConstraint,
    ToolPolicy,
    bind_to_generation,
    lower_constraints,
)
from ninfer.protocols.conversation import RenderedPrompt, ToolDefinition
from ninfer.protocols.openai_chat.protocol import ChatCompletionRequest
from ninfer.protocols.served_model import ServedModel
from ninfer.server.errors import invalid


def chat_tool_policy(request: ChatCompletionRequest, tools: list[ToolDefinition]) -> ToolPolicy:
    """tool_choice (already validated by callable_tools) as a ToolPolicy."""
    mode = request.tool_constraints or "basic"
    parallel = request.parallel_tool_calls is not False
    choice: Any = request.tool_choice
    policy = {"tools": tools, "parallel": parallel, "constraints": mode}
    if choice is None or choice in ("auto", "none", "required"):
        return ToolPolicy(choice=choice or "auto", **policy)
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        name = (choice.get(choice["type"]) or {}).get("name")
        return ToolPolicy(choice="named", allowed=frozenset({name}), **policy)
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        body = choice.get("allowed_tools") or {}
        names = frozenset(
            (entry.get(entry.get("type")) or {}).get("name") for entry in body.get("tools") or []
        )
        return ToolPolicy(choice=body.get("mode", "auto"), allowed=names, **policy)
    return ToolPolicy(choice="auto", **policy)


def chat_constraint(
    request: ChatCompletionRequest,
    tools: list[ToolDefinition],
    output: OutputConstraint | None,
    generation: GenerationRequest,
    served: ServedModel,
    prompt: RenderedPrompt,
) -> GrammarSpec | None:
    """The turn's grammar (None: free generation); sets where it starts on `generation`."""
    if request.tool_constraints not in (None, "basic", "auto"):
        raise invalid("`tool_constraints` must be `basic` or `auto`", "tool_constraints")
    policy = chat_tool_policy(request, tools) if tools else None
    spec = lower_constraints(output, policy, stop_strings=generation.stop_strings)
    if spec is None:
        return None
    return bind_to_generation(
        spec,
        generation,
        thinking_on=prompt.thinking_on,
        tokenizer=served.engine.tokenizer,
        prefill=_prefill_text(request) if prompt.is_prefill else "",
    )


def _prefill_text(request: ChatCompletionRequest) -> str:
    """The final assistant message's text, which generation continues."""
    content = request.messages[-1].content
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part.text or part.refusal or "" for part in content)
