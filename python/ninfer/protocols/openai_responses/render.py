"""Output Items and Response objects, built once for aggregate answers and SSE alike.

`OutputStream` is fed the decoder's channel deltas and then the turn's result. It opens and
closes the output Items as the text arrives and records every semantic event on the way, so
a streamed answer's terminal Items are exactly the concatenation of its deltas and an
aggregate answer (fed in one piece, events dropped) has the same shape. Sequence numbers
are given in emission order, the lifecycle events of the Response included.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from ninfer.outputs.channels import ToolCall
from ninfer.protocols.conversation import CUSTOM_TOOL_INPUT
from ninfer.protocols.openai_responses.items import new_item_id
from ninfer.protocols.openai_responses.lowering import LoweredResponse
from ninfer.protocols.openai_responses.tools import ResponseTools
from ninfer.protocols.turn import TurnResult, TurnUsage

# Every string reasoning.summary gets this one placeholder: the model writes raw reasoning
# only, and a summary would need a second generation.
SUMMARY_PLACEHOLDER = "Reasoning summary not available; the raw reasoning is in the content."


def response_id() -> str:
    return f"resp_{secrets.token_hex(24)}"


def usage(account: TurnUsage) -> dict[str, Any]:
    return {
        "input_tokens": account.prompt_tokens,
        "input_tokens_details": {"cached_tokens": account.cached_tokens},
        "output_tokens": account.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": account.reasoning_tokens},
        "total_tokens": account.total_tokens,
    }


def status_of(result: TurnResult) -> str:
    return "incomplete" if result.finish_reason == "length" else "completed"


class ResponseBuilder:
    """The Response envelope of one request: id, creation time and echoed configuration."""

    def __init__(self, lowered: LoweredResponse, model: str) -> None:
        self.id = response_id()
        self.created_at = int(time.time())
        self.lowered = lowered
        self.model = model

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        account: TurnUsage | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        request, sampling = self.lowered.request, self.lowered.generation.sampling
        reasoning = request.reasoning
        text_format = request.text.format if request.text and request.text.format else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "max_tool_calls": request.max_tool_calls,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "previous_response_id": request.previous_response_id,
            "prompt_cache_key": request.prompt_cache_key,
            "prompt_cache_retention": request.prompt_cache_retention,
            "reasoning": {
                "effort": reasoning.effort if reasoning else None,
                "summary": self.lowered.summary,
            },
            "safety_identifier": request.safety_identifier,
            "service_tier": "default",
            "store": self.lowered.store,
            "temperature": sampling.temperature,
            "text": {"format": text_format or {"type": "text"}, "verbosity": "medium"},
            "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
            "tools": request.tools or [],
            "top_logprobs": 0,
            "top_p": sampling.top_p,
            "truncation": "disabled",
            "usage": usage(account) if account is not None else None,
            "user": request.user,
            "metadata": request.metadata or {},
        }


class OutputStream:
    def __init__(self, lowered: LoweredResponse, tools: ResponseTools) -> None:
        self.summary = lowered.summary is not None
        self.include_encrypted = lowered.include_encrypted
        self.single_call = lowered.request.parallel_tool_calls is False
        self.tools = tools
        self.items: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.sequence = 0
        self._reasoning: dict[str, Any] | None = None  # the open reasoning Item
        self._reasoning_text = ""
        self._message: dict[str, Any] | None = None  # the open message Item
        self._message_text = ""

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.append({"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1

    def take_events(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events

    # ---- reasoning --------------------------------------------------------------------

    def reasoning(self, text: str) -> None:
        if not text:
            return
        if self._reasoning is None:
            self._open_reasoning()
        self._reasoning_text += text
        self.emit(
            "response.reasoning_text.delta",
            **self._at(self._reasoning),
            content_index=0,
            delta=text,
        )

    def _open_reasoning(self) -> None:
        item = {"id": new_item_id("reasoning"), "type": "reasoning", "summary": [], "content": []}
        self._reasoning = item
        if self.summary:
            item["summary"] = [{"type": "summary_text", "text": SUMMARY_PLACEHOLDER}]
        self.items.append(item)
        self.emit("response.output_item.added", output_index=len(self.items) - 1, item=_copy(item))
        if self.summary:
            at = self._at(item)
            part = {"type": "summary_text", "text": ""}
            self.emit("response.reasoning_summary_part.added", **at, summary_index=0, part=part)
            self.emit(
                "response.reasoning_summary_text.delta",
                **at,
                summary_index=0,
                delta=SUMMARY_PLACEHOLDER,
            )
            self.emit(
                "response.reasoning_summary_text.done",
                **at,
                summary_index=0,
                text=SUMMARY_PLACEHOLDER,
            )
            self.emit(
                "response.reasoning_summary_part.done",
                **at,
                summary_index=0,
                part={"type": "summary_text", "text": SUMMARY_PLACEHOLDER},
            )
        self.emit(
            "response.content_part.added",
            **self._at(item),
            content_index=0,
            part={"type": "reasoning_text", "text": ""},
        )

    def close_reasoning(self) -> None:
        item, self._reasoning = self._reasoning, None
        if item is None:
            return
        text = self._reasoning_text
        part = {"type": "reasoning_text", "text": text}
        item["content"] = [part]
        if self.include_encrypted:
            item["encrypted_content"] = text  # a plain mirror: nothing here is encrypted
        at = self._at(item)
        self.emit("response.reasoning_text.done", **at, content_index=0, text=text)
        self.emit("response.content_part.done", **at, content_index=0, part=dict(part))
        self.emit("response.output_item.done", output_index=at["output_index"], item=_copy(item))

    # ---- message ----------------------------------------------------------------------

    def content(self, text: str) -> None:
        if not text:
            return
        self.close_reasoning()
        if self._message is None:
            self._open_message()
        self._message_text += text
        self.emit(
            "response.output_text.delta",
            **self._at(self._message),
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _open_message(self) -> None:
        item = {
            "id": new_item_id("message"),
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        self._message = item
        self.items.append(item)
        self.emit("response.output_item.added", output_index=len(self.items) - 1, item=_copy(item))
        self.emit(
            "response.content_part.added",
            **self._at(item),
            content_index=0,
            part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
        )

    def _close_message(self, status: str) -> None:
        item, self._message = self._message, None
        if item is None:
            return
        part = {
            "type": "output_text",
            "text": self._message_text,
            "annotations": [],
            "logprobs": [],
        }
        item["content"] = [part]
        item["status"] = status
        at = self._at(item)
        self.emit(
            "response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[]
        )
        self.emit("response.content_part.done", **at, content_index=0, part=_copy(part))
        self.emit("response.output_item.done", output_index=at["output_index"], item=_copy(item))

    # ---- the end ----------------------------------------------------------------------

    def finish(self, result: TurnResult) -> str:
        """Close the open Items and publish the tool calls; returns the Response status."""
        status = status_of(result)
        self.close_reasoning()
        calls = result.tool_calls[:1] if self.single_call else result.tool_calls
        if self._message is None and not calls and status == "completed":
            self._open_message()  # a completed turn always answers, if only with ""
        self._close_message(status)
        for call in calls:
            self._tool_call(call)
        return status

    def _tool_call(self, call: ToolCall) -> None:
        identity = self.tools.identity(call.name)
        if identity.custom:
            item: dict[str, Any] = {
                "id": new_item_id("custom_tool_call"),
                "type": "custom_tool_call",
                "call_id": call.id,
                "name": identity.name,
                "input": "",
            }
            value, key, kind = custom_input(call.arguments), "input", "custom_tool_call_input"
        else:
            item = {
                "id": new_item_id("function_call"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": call.id,
                "name": identity.name,
                "arguments": "",
            }
            if identity.namespace is not None:
                item["namespace"] = identity.namespace
            value, key, kind = call.arguments, "arguments", "function_call_arguments"
        self.items.append(item)
        index = len(self.items) - 1
        self.emit("response.output_item.added", output_index=index, item=_copy(item))
        at = self._at(item)
        self.emit(f"response.{kind}.delta", **at, delta=value)
        done = {key: value, **({"name": identity.name} if not identity.custom else {})}
        self.emit(f"response.{kind}.done", **at, **done)
        item[key] = value
        if not identity.custom:
            item["status"] = "completed"
        self.emit("response.output_item.done", output_index=index, item=_copy(item))

    def _at(self, item: dict[str, Any] | None) -> dict[str, Any]:
        assert item is not None
        return {"item_id": item["id"], "output_index": self.items.index(item)}


def custom_input(arguments: str) -> str:
    """A custom tool's one string, from the one-string function the model called."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(CUSTOM_TOOL_INPUT), str):
        return value[CUSTOM_TOOL_INPUT]
    return arguments


def _copy(value: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(value))
