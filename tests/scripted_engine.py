"""A fake engine that plays a script of raw model text, one entry per agent turn.

Real agent clients send more than their task: title and topic probes, quota checks, retries.
The turn is therefore read from the rendered prompt, as a model would see it: a prompt
without a tool list is a side request and gets `side_reply`; a prompt with tools gets
`turns[k]`, where k is the number of tool results (`<tool_response>` blocks, the Qwen
template's rendering of a tool result) already in the conversation. Past the last entry the
last one repeats, so a client that retries sees the same answer. When the prompt ends inside
an open reasoning block (thinking on), a short reasoning closed by `</think>` comes first.
"""

from __future__ import annotations

from fake_engine import FakeEngine
from ninfer.engine_types import EngineConfig, GenerationRequest

TOOL_RESULT_OPEN = "<tool_response>"
THINKING_OPEN = "<think>\n"
SCRIPTED_REASONING = "Following the script.\n</think>\n\n"


class ScriptedEngine(FakeEngine):
    def __init__(
        self,
        turns: list[str],
        *,
        side_reply: str = "Scripted side answer.",
        config: EngineConfig | None = None,
        max_context: int = 262144,
    ) -> None:
        super().__init__(config or EngineConfig(max_concurrency=4), max_context=max_context)
        self.turns = list(turns)
        self.side_reply = side_reply
        self.token_delay = 0.0005
        self.prompts: list[str] = []  # every prompt the engine was given, rendered

    def answer(self, user: str, request: GenerationRequest) -> tuple[list[int], bool]:
        prompt = self.tokenizer.decode(request.prompt_ids)
        self.prompts.append(prompt)
        if "<tools>" not in prompt:
            text = self.side_reply
        else:
            turn = prompt.count(TOOL_RESULT_OPEN)
            text = self.turns[min(turn, len(self.turns) - 1)]
        if prompt.endswith(THINKING_OPEN):  # the template opened reasoning: close it first
            text = SCRIPTED_REASONING + text
        return self.tokenizer.encode(text, allow_special=False), False

    def tool_prompts(self) -> list[str]:
        """The prompts of agent turns (those that carried the tool list), in order."""
        return [p for p in self.prompts if "<tools>" in p]
