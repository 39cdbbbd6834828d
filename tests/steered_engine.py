"""The real engine, steered by grammars: random weights choose every token, a regex per agent
turn chooses what they may choose from.

Random weights never decide to call a tool, so on their own they cannot show that a call the
sampler produced reaches an agent client intact. A test therefore names one of the client's
own tools and a pattern for its argument; the engine then constrains an agent turn (a prompt
that carries the tool list) to

    turn 0: one Qwen XML call to that tool, the argument drawn by the model within the pattern
    later turns (a tool result is in the prompt): a short final answer, FINAL_PATTERN

and everything else (model forward, sampler, grammar masks on the 248k vocabulary, EOS
after a complete sentence) is the production path. Side requests without tools run free.
The server's protocol layer is untouched: it decodes the output as it would any model's, so
whatever the client receives is what a real model's identical tokens would give it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ninfer.engine import AsyncEngine, RequestHandle
from ninfer.engine_types import GenerationRequest

TOOL_RESULT_OPEN = "<tool_response>"
THINKING_OPEN = "<think>\n"
FINAL_PATTERN = r"Done: [a-z]{3,8}\."


@dataclass(frozen=True)
class ToolTurn:
    function: str  # the client's tool, as the prompt's tool list names it
    parameter: str  # its string parameter the model fills in
    value: str  # a regex for that value (keep it short: the output ceiling applies)
    every_turn: bool = False  # each agent turn is the call (a replayed mid-session request)


def _escaped(text: str) -> str:
    return re.sub(r"([\\.^$|?*+()\[\]{}/-])", r"\\\1", text).replace("\n", r"\n")


def call_pattern(turn: ToolTurn) -> str:
    framing = f"<tool_call>\n<function={turn.function}>\n<parameter={turn.parameter}>\n"
    closing = "\n</parameter>\n</function>\n</tool_call>"
    return _escaped(framing) + turn.value + _escaped(closing)


class SteeredEngine(AsyncEngine):
    tool_turn: ToolTurn | None = None  # None: no steering, the engine is the plain one

    def submit(self, request: GenerationRequest) -> RequestHandle:
        turn = self.tool_turn
        if turn is not None:
            prompt = self.tokenizer.decode(request.prompt_ids)
            if "<tools>" in prompt:
                self._steer(request, prompt, turn)
        return super().submit(request)

    def _steer(self, request: GenerationRequest, prompt: str, turn: ToolTurn) -> None:
        first = turn.every_turn or TOOL_RESULT_OPEN not in prompt
        pattern = call_pattern(turn) if first else FINAL_PATTERN
        if prompt.endswith(THINKING_OPEN):  # the template opened reasoning: close it first
            pattern = _escaped("</think>\n\n") + pattern
        # Compiled grammars are cached by source in the core: a repeat costs a lookup.
        request.constraint = self.compile_constraint("regex", pattern)
        request.constraint_start_after = -1
        request.constraint_prefix = ""
        request.thinking_budget = None  # the pattern closes reasoning itself
