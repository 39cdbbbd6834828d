"""Chat Completions' output and tool constraints -> the shared constraint lowering."""

from __future__ import annotations

from typing import Any

from ninfer.engine_types import GenerationRequest
from ninfer.protocols.constraints import (
    GrammarSpec,
    OutputConstraint,
    ToolPolicy,
    check_tool_constraints,
    plan_turn_constraint,
)
from ninfer.protocols.conversation import Conversation, RenderedPrompt, ToolDefinition
from ninfer.protocols.openai_chat.protocol import ChatCompletionRequest
from ninfer.protocols.served_model import ServedModel


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
    conversation: Conversation,
    output: OutputConstraint | None,
    generation: GenerationRequest,
    served: ServedModel,
    prompt: RenderedPrompt,
) -> GrammarSpec | None:
    """The turn's grammar (None: free generation); sets where it starts on `generation`."""
    check_tool_constraints(request.tool_constraints)
    tools = conversation.tools
    policy = chat_tool_policy(request, tools) if tools else None
    return plan_turn_constraint(
        output, policy, generation, prompt, conversation, served.engine.tokenizer
    )
