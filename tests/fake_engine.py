"""A fast stand-in for ninfer.engine.AsyncEngine with the same contract.

The "model" answers from the prompt text, so every behaviour the server relies on can be
checked exactly: lanes and pending capacity, admission timeouts, cancellation, stop strings
withheld on bytes, UTF-8 split across tokens, seeds, and failures mid-stream.

Answers (to the last user message T):
  greedy          "You said: T."
  sampled         "You said: T." plus eight words drawn with the request's seed
  "long: ..."     "tick " until max_tokens or cancel
  "fail: ..."     a few tokens, then finish_reason "error"
  "slow: ..."     like greedy but waits `slow_pause` before the first token
  T in `scripted` the raw reply text scripted[T] (reasoning and tool-call markup included)
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections import Counter
from collections.abc import AsyncIterator

from ninfer.engine_types import (
    ContextLengthExceeded,
    EngineConfig,
    EngineEvent,
    EngineOverloaded,
    EngineUnavailable,
    GenerationRequest,
    QueueTimeout,
    Timings,
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]


class FakeTokenizer:
    """Bytes are tokens (id = byte + 3) plus three special tokens."""

    SPECIALS = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    OFFSET = 3
    vocab_size = 256 + 3
    bos_token_id = 1
    eos_token_ids = [2]
    _special_re = re.compile("|".join(re.escape(s) for s in SPECIALS))

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        ids: list[int] = []
        pos = 0
        if allow_special:
            for match in self._special_re.finditer(text):
                ids += self._bytes(text[pos : match.start()])
                ids.append(self.SPECIALS[match.group()])
                pos = match.end()
        return ids + self._bytes(text[pos:])

    def _bytes(self, text: str) -> list[int]:
        return [b + self.OFFSET for b in text.encode()]

    def decode(self, ids: list[int]) -> str:
        names = {v: k for k, v in self.SPECIALS.items()}
        out = bytearray()
        for i in ids:
            out += names[i].encode() if i in names else bytes([i - self.OFFSET])
        return out.decode(errors="replace")


class FakeHandle:
    def __init__(self, engine: FakeEngine, request_id: int, request: GenerationRequest) -> None:
        self.request_id = request_id
        self.request = request
        self._engine = engine
        self._has_lane = False
        self._released = False
        self.cancelled = False
        self._wake = asyncio.Event()
        self._submitted = time.perf_counter()
        self._admitted_at: float | None = None
        self._settled = False  # its outcome is counted (stats())

    async def admitted(self) -> None:
        if self._has_lane:
            return
        if self.cancelled:
            raise EngineUnavailable("request was cancelled")
        timeout = self._engine.config.pending_timeout_ms / 1000 or None
        try:
            await asyncio.wait_for(self._engine._lanes.acquire(), timeout)
        except TimeoutError:
            self._release()
            self._settled = True
            self._engine.counts["queue_timeouts"] += 1
            raise QueueTimeout("no lane within the pending deadline") from None
        if self.cancelled:  # cancelled while waiting: give the lane straight back
            self._engine._lanes.release()
            raise EngineUnavailable("request was cancelled")
        self._has_lane = True
        self._engine.active += 1
        self._engine.counts["prompt_tokens"] += len(self.request.prompt_ids)
        self._engine.counts["tokens_prefilled"] += len(self.request.prompt_ids)
        self._admitted_at = time.perf_counter()

    def cancel(self) -> None:
        if not self._settled:  # the engine's count, whether or not anyone reads the end
            self._settled = True
            self._engine.counts["finished_cancelled"] += 1
        self.cancelled = True
        self._wake.set()
        self._release()

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        self._engine.outstanding -= 1
        if self._has_lane:
            self._engine.active -= 1
            self._engine._lanes.release()

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[EngineEvent]:
        try:
            await self.admitted()
            async for event in self._generate():
                yield event
        finally:
            self._release()

    async def _generate(self) -> AsyncIterator[EngineEvent]:
        engine, req = self._engine, self.request
        engine.requests.append(req)
        user = _last_user_text(engine.tokenizer, req.prompt_ids)
        answer, endless = engine.answer(user, req)
        if user.startswith("slow:"):
            await self._sleep(engine.slow_pause)
        if req.report_progress:  # one event per committed prefill chunk that leaves more
            chunk = max(engine.config.prefill_chunk, 1)
            for processed in range(chunk, len(req.prompt_ids), chunk):
                yield EngineEvent(
                    self.request_id,
                    [],
                    b"",
                    prompt_tokens=len(req.prompt_ids),
                    prompt_processed=processed,
                )
        prompt_done = time.perf_counter()
        stops = [s.encode() for s in req.stop_strings]
        held = b""
        count = 0
        position = 0
        while True:
            if self.cancelled:
                yield self._final(b"", count, "cancelled", None, prompt_done)
                return
            if count >= req.max_tokens:
                yield self._final(held, count, "length", None, prompt_done)
                return
            if user.startswith("fail:") and count == 3:
                event = self._final(b"", count, "error", None, prompt_done)
                event.error = "simulated device failure"
                yield event
                return
            if endless:
                token = answer[position % len(answer)]
            elif position < len(answer):
                token = answer[position]
            else:
                token = None
            position += 1
            count += 1
            if token is None:  # eos: counted and listed, its text withheld (as the engine does)
                eos = engine.tokenizer.eos_token_ids[0]
                event = self._final(held, count, "stop", eos, prompt_done)
                event.token_ids = [eos]
                yield event
                return
            held += bytes([token - FakeTokenizer.OFFSET])
            for stop in stops:
                at = held.find(stop)
                if at >= 0:
                    yield self._final(held[:at], count, "stop", stop.decode(), prompt_done)
                    return
            keep = _longest_stop_prefix(held, stops)
            visible, held = held[: len(held) - keep], held[len(held) - keep :]
            engine.counts["tokens_decoded"] += 1
            engine.counts["decode_tokens"] += count > 1
            yield EngineEvent(self.request_id, [token], visible)
            await self._sleep(engine.token_delay)

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            pass

    def _final(
        self,
        text: bytes,
        count: int,
        reason: str,
        stop_reason: str | int | None,
        prompt_done: float,
    ) -> EngineEvent:
        now = time.perf_counter()
        admitted = self._admitted_at or now
        if not self._settled:
            self._settled = True
            self._engine.counts[f"finished_{reason}"] += 1
        if reason == "stop":  # the token that stopped (eos, or the end of a stop string) counts
            self._engine.counts["tokens_decoded"] += 1
            self._engine.counts["decode_tokens"] += count > 1
        return EngineEvent(
            self.request_id,
            [],
            text,
            finished=True,
            finish_reason=reason,
            stop_reason=stop_reason,
            prompt_tokens=len(self.request.prompt_ids),
            completion_tokens=count,
            timings=Timings(
                queue_ms=(admitted - self._submitted) * 1000,
                prompt_ms=(prompt_done - admitted) * 1000,
                predicted_ms=(now - prompt_done) * 1000,
                decode_share_ms=(now - prompt_done) * 1000,  # one stream: all its own
            ),
        )


def _last_user_text(tokenizer: FakeTokenizer, ids: list[int]) -> str:
    """Read turns by special-token ids, as a model does: spelled markers are just text."""
    start, end = tokenizer.SPECIALS["<|im_start|>"], tokenizer.SPECIALS["<|im_end|>"]
    user = ""
    for i, token in enumerate(ids):
        if token != start:
            continue
        close = ids.index(end, i) if end in ids[i:] else len(ids)
        turn = tokenizer.decode(ids[i + 1 : close])
        if turn.startswith("user\n"):
            user = turn[len("user\n") :]
    return user


def _longest_stop_prefix(held: bytes, stops: list[bytes]) -> int:
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(held)), 0, -1):
            if held.endswith(stop[:k]):
                best = max(best, k)
                break
    return best


class FakeEngine:
    def __init__(self, config: EngineConfig | None = None, *, max_context: int = 4096) -> None:
        self.config = config or EngineConfig()
        self.tokenizer = FakeTokenizer()
        self.header = {
            "format_version": 1,
            "metadata": {"name": "fake-chat"},
            "architecture": "llama",
            "generation": {},
            "tokenizer": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
        }
        self.max_context = max_context
        self.model_info = {
            "n_vocab": FakeTokenizer.vocab_size,
            "n_ctx": max_context,
            "n_ctx_train": 8192,
            "n_embd": 64,
            "n_params": 123456,
            "size": 493824,
            "ftype": "f32",
            "architecture": "llama",
            "name": "fake-chat",
        }
        self.healthy = True
        self.token_delay = 0.002
        self.slow_pause = 0.0
        self.active = 0
        self.outstanding = 0
        self.requests: list[GenerationRequest] = []
        self.scripted: dict[str, str] = {}
        self._next_id = 0
        self._lanes_obj: asyncio.Semaphore | None = None
        self.counts: Counter[str] = Counter()  # what the native engine's stats() counts

    def stats(self) -> dict[str, int | bool]:
        """The native engine's snapshot shape (the subset this fake can count)."""
        return {
            **self.counts,
            "lanes": self.config.max_concurrency,
            "running": self.active,
            "pending": self.outstanding - self.active,
            "healthy": self.healthy,
        }

    @classmethod
    def open(cls, artifact_path: str, config: EngineConfig) -> FakeEngine:
        return cls(config)

    @property
    def _lanes(self) -> asyncio.Semaphore:
        if self._lanes_obj is None:
            self._lanes_obj = asyncio.Semaphore(self.config.max_concurrency)
        return self._lanes_obj

    def chat_template(self) -> str | None:
        return CHATML_TEMPLATE

    def submit(self, request: GenerationRequest) -> FakeHandle:
        if not self.healthy:
            raise EngineUnavailable("engine failed")
        if request.max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        if len(request.prompt_ids) > self.max_context:
            raise ContextLengthExceeded(len(request.prompt_ids), self.max_context)
        if self.outstanding >= self.config.max_concurrency + self.config.max_pending_requests:
            self.counts["submits_refused"] += 1
            raise EngineOverloaded("capacity full")
        self.outstanding += 1
        self._next_id += 1
        return FakeHandle(self, self._next_id, request)

    def answer(self, user: str, request: GenerationRequest) -> tuple[list[int], bool]:
        """Token ids of the reply and whether it repeats forever."""
        if user.startswith("long:"):
            return self.tokenizer.encode("tick ", allow_special=False), True
        if user in self.scripted:
            return self.tokenizer.encode(self.scripted[user], allow_special=False), False
        text = f"You said: {user}."
        if request.sampling.temperature > 0:
            rng = random.Random(request.sampling.seed)  # None: fresh entropy
            text += " " + " ".join(rng.choice(WORDS) for _ in range(8))
        return self.tokenizer.encode(text, allow_special=False), False

    async def warmup(self, prompt_tokens: int = 1, max_tokens: int = 2) -> None:
        return None

    async def close(self) -> None:
        self.healthy = False
