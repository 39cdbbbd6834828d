"""Async bridge between the asyncio server and the native engine (ninfer._core.Engine).

The core runs its own worker thread and publishes events into a queue whose file descriptor
becomes readable when events are waiting. The bridge watches that descriptor with
`loop.add_reader`, drains in batches and routes each event to its request's handle. No call
here waits on the device: submit and cancel only take the core's lock (with the GIL released).

Handle semantics (the server codes against these):
  * `await handle.admitted()` returns once the request holds a lane; it raises QueueTimeout
    when the pending deadline passed first, and EngineUnavailable when the request was
    cancelled, or the engine failed or closed, before admission.
  * `async for event in handle` first awaits admission (raising as above), then yields
    EngineEvents until one with finished=True.
  * `handle.cancel()` is idempotent and immediate; a running request then ends with a
    finish_reason "cancelled" event. Dropping a handle that has not finished cancels it.
  * A finished event's stop_reason is the matched stop string, or the token id (an eos id or
    one of the request's stop_token_ids) for finish_reason "stop"; None otherwise. token_ids
    include a stop token, whose text is withheld; completion_tokens counts it.
  * Engine shutdown or failure ends running requests with finish_reason "error" (and
    `error` set); pending ones raise EngineUnavailable from admitted().
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from ninfer.engine_types import (
    ContextLengthExceeded,
    EngineConfig,
    EngineEvent,
    EngineOverloaded,
    EngineUnavailable,
    GenerationRequest,
    QueueTimeout,
    ThinkingBudget,
    Timings,
)

_INT32_MAX = 2**31 - 1
_log = logging.getLogger("ninfer.engine")


def _core_module() -> Any:
    from ninfer import _core

    return _core


def core_options(config: EngineConfig, eos_ids: Sequence[int]) -> Any:
    """The native EngineOptions for an EngineConfig."""
    if not 1 <= config.max_concurrency <= 8:
        raise ValueError(f"max_concurrency must be between 1 and 8, got {config.max_concurrency}")
    return _core_module().EngineOptions(
        max_concurrency=config.max_concurrency,
        max_context=config.max_context,
        prefill_chunk=config.prefill_chunk,
        max_pending=config.max_pending_requests,
        pending_timeout_ms=config.pending_timeout_ms,
        eos_ids=list(eos_ids),
        mtp_draft_tokens=config.mtp_draft_tokens,
        ngram_draft_tokens=config.ngram_draft_tokens,
        ngram_min_match=config.ngram_min_match,
        lm_head_draft_tokens=config.lm_head_draft_tokens,
        spec_max_batch=config.spec_max_batch,
        kv_capacity=config.kv_capacity,
        kv_dtype=config.kv_dtype,
        vram_headroom_mib=config.vram_headroom_mib,
        prefix_reuse=config.prefix_reuse,
        snapshot_slots=config.snapshot_slots,
        taps_per_request=config.taps_per_request,
        tap_ladder=config.tap_ladder,
        tap_min_gap=config.tap_min_gap,
        host_context_bytes=config.host_context_bytes,
    )


def _to_event(core_event: Any) -> EngineEvent:
    return EngineEvent(
        request_id=core_event.request_id,
        token_ids=core_event.token_ids,
        text=core_event.text,
        finished=core_event.finished,
        finish_reason=core_event.finish_reason,
        stop_reason=core_event.stop_reason,
        prompt_tokens=core_event.prompt_tokens,
        completion_tokens=core_event.completion_tokens,
        # Only the finished event carries timings; skipping them saves four reads a token.
        timings=(
            Timings(
                core_event.queue_ms,
                core_event.prompt_ms,
                core_event.predicted_ms,
                core_event.decode_share_ms,
                core_event.draft_n,
                core_event.draft_n_accepted,
            )
            if core_event.finished
            else None
        ),
        error=core_event.error,
        constraint=getattr(core_event, "constraint", None),
        cached_tokens=core_event.cached_tokens,
        speculative=core_event.speculative,
        scheduling=getattr(core_event, "scheduling", None) if core_event.finished else None,
    )


def _thinking_budget_options(budget: ThinkingBudget) -> dict[str, Any]:
    return {
        "thinking_budget": min(max(budget.limit, 0), _INT32_MAX),
        "thinking_open": budget.starts_open,
        "think_open_id": -1 if budget.open_id is None else budget.open_id,
        "think_close_id": -1 if budget.close_id is None else budget.close_id,
        "thinking_close_ids": list(budget.close_ids),
    }


def _constraint_arguments(request: GenerationRequest) -> dict[str, Any]:
    if request.constraint is None:
        return {}
    return {
        "constraint": request.constraint,
        "constraint_start_after": request.constraint_start_after,
        "constraint_prefix": request.constraint_prefix,
    }


class RequestHandle:
    """One submitted request: admission, its event stream, cancellation."""

    def __init__(self, engine: AsyncEngine, request_id: int) -> None:
        self.request_id = request_id
        self._engine = engine
        # One consumer reads these; `_waiter` is its pending wait (a bare future, no Task).
        self._events: collections.deque[EngineEvent] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._admission = asyncio.Event()
        self._admission_error: Exception | None = None
        self._finished = False  # the core reported the end (event queued or admission failed)
        self._consumed = False  # the consumer received the finished event
        self._cancel_sent = False
        self.cached_tokens = 0  # the prefix cache's reuse, known once admitted
        self._queued_progress: EngineEvent | None = None  # a progress event not yet consumed
        self.seed: int | None = None

    async def admitted(self) -> None:
        await self._admission.wait()
        if self._admission_error is not None:
            raise self._admission_error

    def cancel(self) -> None:
        if self._cancel_sent or self._finished:
            return
        self._cancel_sent = True
        if not self._admission.is_set():
            self._fail_admission(EngineUnavailable("request was cancelled"))
        self._engine._cancel(self.request_id)

    def __aiter__(self) -> RequestHandle:
        return self

    async def __anext__(self) -> EngineEvent:
        event = await self.next_within(None)
        assert event is not None  # no timeout: only an event ends the wait
        return event

    async def next_within(self, timeout: float | None) -> EngineEvent | None:
        """The next event, or None once `timeout` seconds pass without one (nothing is lost:
        ask again). A stream uses it to send keep-alives while the engine is quiet without a
        Task per event. Raises StopAsyncIteration after the finished event, and what
        admitted() raises before admission."""
        if self._consumed:
            raise StopAsyncIteration
        if not self._admission.is_set() and timeout is not None:
            try:  # rare (streams wait for their lane first): a Task here is fine
                await asyncio.wait_for(self._admission.wait(), timeout)
            except TimeoutError:
                return None
        if not self._admission.is_set() or self._admission_error is not None:
            await self.admitted()
        if not self._events and not await self._wait_for_event(timeout):
            return None
        event = self._events.popleft()
        if event is self._queued_progress:
            self._queued_progress = None
        if event.finished:
            self._consumed = True
        return event

    def ready(self) -> int:
        """Events delivered and not read yet: next_within returns at once while this is > 0
        (a stream holds its frames until it is 0, server/sse.py)."""
        return len(self._events)

    async def _wait_for_event(self, timeout: float | None) -> bool:
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _wake, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        return bool(self._events)

    async def aclose(self) -> None:
        self.cancel()

    async def __aenter__(self) -> RequestHandle:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()

    def __del__(self) -> None:
        # A consumer that walked away (dropped the handle) must not keep a lane busy.
        if not self._finished and not self._cancel_sent:
            with contextlib.suppress(Exception):
                self._engine._cancel(self.request_id)

    # --- called by the engine's reader -------------------------------------------------

    def _fail_admission(self, error: Exception) -> None:
        self._admission_error = error
        self._admission.set()

    def _deliver(self, core_event: Any) -> None:
        kind = core_event.kind
        if kind == "scheduling":  # a pause/restore boundary: for the request log only
            observe = self._engine.on_scheduling
            if observe is not None:
                observe(self.request_id, core_event.transition)
            return
        if kind == "admitted":
            self.cached_tokens = getattr(core_event, "cached_tokens", 0)
            self._admission.set()
            return
        if kind == "queue_timeout":
            self._finished = True
            self._fail_admission(QueueTimeout(core_event.error or "request queue timeout"))
            return
        if kind == "prompt_progress":
            if self._admission_error is not None:
                return
            if self._queued_progress is not None:
                # The consumer is slower than prefill: the event it has not read yet now
                # carries the newest frontier instead of a second event queueing behind it.
                self._queued_progress.prompt_processed = core_event.prompt_processed
                return
            self._queued_progress = EngineEvent(
                request_id=core_event.request_id,
                token_ids=[],
                text=b"",
                prompt_tokens=core_event.prompt_tokens,
                prompt_processed=core_event.prompt_processed,
            )
            self._events.append(self._queued_progress)
            if self._waiter is not None:
                _wake(self._waiter)
            return
        if core_event.finished:
            self._finished = True
        if not self._admission.is_set() or self._admission_error is not None:
            # Ended before it ever held a lane: cancelled, or the engine failed/closed.
            if not self._admission.is_set():
                if core_event.finish_reason == "cancelled":
                    self._fail_admission(EngineUnavailable("request was cancelled"))
                else:
                    self._fail_admission(
                        EngineUnavailable(core_event.error or "engine unavailable")
                    )
            return
        self._events.append(_to_event(core_event))
        if self._waiter is not None:
            _wake(self._waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class AsyncEngine:
    """The server's engine: a native core plus the artifact's tokenizer and metadata."""

    def __init__(
        self,
        core: Any,
        *,
        tokenizer: Any = None,
        header: dict[str, Any] | None = None,
        model_info: dict[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> None:
        self._core = core
        self.tokenizer = tokenizer
        self.header: dict[str, Any] = header or {}
        # The ceiling of one request: --max-context, or the shared KV pool when it is smaller.
        self.kv_capacity: int | None = getattr(core, "kv_capacity", None)
        self.max_context: int = min(core.max_context, self.kv_capacity or core.max_context)
        self.model_info: dict[str, Any] = model_info or self._default_model_info()
        self._chat_template = chat_template
        self._handles: weakref.WeakValueDictionary[int, RequestHandle] = (
            weakref.WeakValueDictionary()
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._failure_logged = False
        self.prefix_cache_file: str | None = None  # saved on close when set
        # Seconds prepare_grammars took to build the grammar vocabulary (None: not built yet).
        self.grammar_vocabulary_seconds: float | None = None
        self._grammar_build: threading.Thread | None = None  # close() waits for it
        # Called once, on the event loop, when a fatal device error stopped the engine (the
        # server then exits: the device cannot be used again in this process).
        self.on_device_failure: Callable[[str], None] | None = None
        # Called with (request id, transition) at each pause/restore boundary of a request.
        self.on_scheduling: Callable[[int, dict[str, Any]], None] | None = None
        self._device_failure_reported = False

    # --- construction --------------------------------------------------------------------

    @classmethod
    def open(cls, artifact_path: str | Path, config: EngineConfig) -> AsyncEngine:
        """Loads an artifact: header, tokenizer, token byte table, then the native model."""
        from ninfer.engine_loading import load_engine_parts

        parts = load_engine_parts(Path(artifact_path), config)
        engine = cls(
            parts.core,
            tokenizer=parts.tokenizer,
            header=parts.header,
            model_info=parts.model_info,
            chat_template=parts.chat_template,
        )
        if config.prefix_cache_file:
            engine.load_prefix_cache(config.prefix_cache_file)
        return engine

    def _default_model_info(self) -> dict[str, Any]:
        info = self._core.model_info
        return {
            "n_vocab": info["vocab_size"],
            "n_ctx": self.max_context,
            "n_ctx_train": info["max_position_embeddings"],
            "kv_capacity": self.kv_capacity,
            "kv_dtype": getattr(self._core, "kv_dtype", "bf16"),
            "n_embd": info["hidden_size"],
            "n_params": info["num_params"],
            "size": info["weight_bytes"],
            "ftype": info["weight_format"],
            "architecture": info["architecture"],
            "name": self.header.get("metadata", {}).get("name", info["architecture"]),
        }

    # --- public API ----------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        return not self._closed and bool(self._core.healthy)

    @property
    def device_failure(self) -> str | None:
        """The fatal device error (e.g. a CUDA illegal address) that stopped the engine."""
        return getattr(self._core, "device_failure", None)

    def chat_template(self) -> str | None:
        return self._chat_template

    def stats(self) -> dict[str, Any]:
        """Scheduler gauges and token counters of the core (for metrics)."""
        return self._core.stats()

    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Queues a request; raises EngineOverloaded, ContextLengthExceeded, ValueError or
        EngineUnavailable synchronously. Must be called from the event loop's thread."""
        if self._closed:
            raise EngineUnavailable("the engine is closed")
        self._watch_events()
        s = request.sampling
        budget = request.thinking_budget
        result = self._core.submit(
            request.prompt_ids,
            # Output is capped by the context ceiling anyway; keep huge budgets in int32.
            min(request.max_tokens, _INT32_MAX),
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=min(s.top_k, _INT32_MAX),
            min_p=s.min_p,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            seed=None if s.seed is None else s.seed & 0xFFFF_FFFF_FFFF_FFFF,
            stop_token_ids=request.stop_token_ids,
            stop_strings=request.stop_strings,
            ignore_eos=request.ignore_eos,
            min_tokens=min(request.min_tokens, _INT32_MAX),
            **({"cache_candidates": request.cache_candidates} if request.cache_candidates else {}),
            report_progress=request.report_progress,
            **(_thinking_budget_options(budget) if budget is not None else {}),
            **_constraint_arguments(request),
        )
        status = result.status
        if status == "overloaded":
            raise EngineOverloaded(result.message)
        if status == "context_exceeded":
            raise ContextLengthExceeded(result.prompt_tokens, result.max_context)
        if status == "invalid":
            raise ValueError(result.message)
        if status == "unavailable":
            raise EngineUnavailable(result.message)
        handle = RequestHandle(self, result.request_id)
        handle.seed = result.seed  # the sampler's seed, drawn by the core when none was given
        self._handles[result.request_id] = handle
        return handle

    def compile_constraint(self, kind: str, source: str, lead: str = "") -> Any:
        """Compiles (or finds in the cache) an output constraint; blocking, so call it off the
        event loop. Raises ValueError (the core's GrammarError) when the source is rejected."""
        return self._core.compile_grammar(kind, source, lead)

    def prepare_grammars(self) -> threading.Thread:
        """Builds the grammar vocabulary (the tokenizer table every constraint compiles
        against: seconds on a 248k vocabulary) on a background thread now, at load, rather
        than inside the first constrained request. A compile that arrives meanwhile waits for
        this build instead of starting a second one. Returns the thread (tests join it)."""

        def build() -> None:
            try:
                seconds = self._core.prepare_grammars()
            except Exception as exc:  # the first compile reports it to its request
                _log.warning("grammar vocabulary not built at load: %s", exc)
                return
            self.grammar_vocabulary_seconds = seconds
            _log.info(
                "grammar vocabulary ready: %d tokens in %.2f s", self.model_info["n_vocab"], seconds
            )

        thread = threading.Thread(target=build, name="ninfer-grammar-vocabulary", daemon=True)
        thread.start()
        self._grammar_build = thread
        return thread

    async def warmup(self, prompt_tokens: int = 1, max_tokens: int = 2) -> None:
        """Runs a greedy generation so the first real request does not pay for first-touch
        costs (page faults of the weights, thread start-up). A longer warm-up (ninfer-serve
        on a GPU: one whole prefill chunk, then a few decode steps) also loads the prefill
        kernels and GEMM choices for a full chunk, grows the scratch buffers to prefill size
        and captures the batch-1 decode graph, which otherwise cost the first long prompt
        ~50 ms of TTFT and its second token a graph capture (H200, 27B shape)."""
        room = max(1, self.max_context - max_tokens)
        prompt = [self._warmup_token()] * max(1, min(prompt_tokens, room))
        handle = self.submit(GenerationRequest(prompt_ids=prompt, max_tokens=max_tokens))
        handle_events = [event async for event in handle]
        last = handle_events[-1]
        if last.finish_reason == "error":
            raise EngineUnavailable(f"warmup failed: {last.error}")

    def _warmup_token(self) -> int:
        bos = self.header.get("tokenizer", {}).get("bos_token_id")
        return bos if isinstance(bos, int) and 0 <= bos < self.model_info["n_vocab"] else 0

    async def close(self) -> None:
        """Fails every queued and running request ("the engine is shutting down") and stops
        the worker."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._core.shutdown)
        build = self._grammar_build
        if build is not None and build.is_alive():
            # A start-up that fails or is interrupted early can get here while the build still
            # runs in the core: tearing the core down under it aborts the process.
            _log.info("waiting for the grammar vocabulary build to finish")
            await asyncio.to_thread(build.join)
        self._dispatch()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._core.event_fd)
        self._loop = None
        if self.prefix_cache_file and self.device_failure is not None:
            _log.warning("not saving the prefix cache: the device failed, its contents are lost")
        elif self.prefix_cache_file:
            _log.info("saving the prefix cache to %s", self.prefix_cache_file)
            report = await asyncio.to_thread(self._core.save_prefix_cache, self.prefix_cache_file)
            (_log.info if report["ok"] else _log.error)("prefix cache: %s", report["message"])

    def load_prefix_cache(self, path: str) -> dict[str, Any]:
        """Restores the prefix cache from `path` (before serving) and saves it there on close."""
        self.prefix_cache_file = path
        _log.info("reading the prefix cache file %s", path)
        report = self._core.load_prefix_cache(path)
        missing = not report["ok"] and report["message"].startswith("no prefix cache file")
        (_log.info if report["ok"] or missing else _log.warning)(
            "prefix cache: %s", report["message"]
        )
        return report

    # --- event routing -------------------------------------------------------------------

    def _watch_events(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        # A new loop (e.g. warmup ran under its own asyncio.run): move the reader over.
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._core.event_fd)
        loop.add_reader(self._core.event_fd, self._dispatch)
        self._loop = loop

    def _dispatch(self) -> None:
        failures: set[str] = set()
        for core_event in self._core.drain_events():
            if core_event.finish_reason == "error" and core_event.error:
                failures.add(core_event.error)
            handle = self._handles.get(core_event.request_id)
            if handle is None:
                continue  # dropped handle: its cancel is already on the way
            handle._deliver(core_event)
            if handle._finished:
                self._handles.pop(core_event.request_id, None)
        if failures:
            self._log_failures(failures)

    def _log_failures(self, failures: set[str]) -> None:
        device_failure = self.device_failure
        if device_failure is not None:
            if not self._device_failure_reported:
                self._device_failure_reported = True
                self._failure_logged = True
                _log.critical(
                    "engine | %s - the device cannot be used again: exiting", device_failure
                )
                if self.on_device_failure is not None:
                    self.on_device_failure(device_failure)
            return
        if not self._core.healthy:
            if not self._failure_logged:
                self._failure_logged = True
                _log.error("engine | engine stopped: %s", sorted(failures)[0])
            return
        for message in sorted(failures):
            oom = "model step failed: out of memory: "
            if message.startswith(oom):
                _log.warning("engine | worker out of memory: %s - recovering", message[len(oom) :])
            elif message.startswith("model step failed") or message.startswith("sampling failed"):
                _log.warning("engine | worker recovering from a failed request: %s", message)

    def _cancel(self, request_id: int) -> None:
        self._core.cancel(request_id)
