"""Typed hand-off between the protocol layer and the engine bridge (python/ninfer/engine.py).

Protocols lower every request to one GenerationRequest and read EngineEvents back. Nothing
here knows about HTTP; nothing in the protocol layer touches the native core directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # None = fresh entropy; same seed + same request => same output


@dataclass(slots=True)
class ThinkingBudget:
    """A thinking-token cap the engine enforces on committed tokens.

    Once `limit` tokens were committed while thinking is open and it is still open, the engine
    commits `close_ids` (the early-close guidance ending in the close marker) without sampling,
    then generation continues. A natural close, a stop or the output limit acts first.
    """

    limit: int  # >= 0
    close_ids: list[int]  # guidance + close marker + the line break after it
    starts_open: bool = True  # the prompt ends inside an opened thinking block
    open_id: int | None = None  # the model may open thinking with this token
    close_id: int | None = None  # committing it closes thinking


@dataclass(slots=True)
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int  # >= 0; 0 = prompt processing only
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: list[int] = field(default_factory=list)  # in addition to the model's eos ids
    stop_strings: list[str] = field(default_factory=list)  # matched on bytes; text withheld
    ignore_eos: bool = False
    min_tokens: int = 0  # eos and stops are suppressed until this many tokens exist
    cache_candidates: list[int] = field(default_factory=list)  # prefix-cache write hints
    thinking_budget: ThinkingBudget | None = None
    # A grammar compiled by AsyncEngine.compile_constraint: tokens outside it are never
    # sampled. It applies after `constraint_start_after` is generated (-1: from the start).
    constraint: Any = None
    constraint_start_after: int = -1
    constraint_prefix: str = ""  # answer text already given (a prefill), consumed first
    report_progress: bool = False  # a prompt-progress event after each prefill chunk


@dataclass(slots=True)
class Timings:
    queue_ms: float = 0.0  # waiting for a lane
    prompt_ms: float = 0.0  # prefill
    predicted_ms: float = 0.0  # decode
    decode_share_ms: float = 0.0  # this request's share of its batched decode rounds
    draft_n: int = 0  # speculative proposals verified so far
    draft_n_accepted: int = 0  # of which the target accepted


@dataclass(slots=True)
class EngineEvent:
    """One batch of committed output for a request.

    `text` holds the bytes that are safe to show (a possible stop-string prefix is held back
    until it resolves; a matched stop string and what follows it never appear). It may end
    inside a UTF-8 sequence: decode incrementally.
    """

    request_id: int
    token_ids: list[int]
    text: bytes
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "error"
    stop_reason: str | int | None = None  # the matched stop string or stop token id
    prompt_tokens: int = 0
    completion_tokens: int = 0
    timings: Timings | None = None  # set on the finished event
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache (fixed at admission)
    error: str | None = None
    # Finished events of a speculating engine: rounds, drafted/accepted tokens, ... (the
    # request log's request_done.speculative); None without speculative work.
    speculative: dict[str, Any] | None = None
    constraint: dict[str, Any] | None = None  # constrained requests: the matcher's counters
    # Set only on a prompt-progress event (GenerationRequest.report_progress): the prompt
    # tokens committed so far, after a prefill chunk that left more prompt. It has no tokens.
    prompt_processed: int | None = None
    # On the finished event: how pressure pauses affected the request (preemptions,
    # replayed_tokens, paused_seconds).
    scheduling: dict[str, Any] | None = None


class EngineError(Exception):
    """Base class of typed engine refusals; the server maps each to an HTTP status."""


class EngineOverloaded(EngineError):
    """All lanes busy and the pending queue is full (HTTP 429 server_overloaded)."""


class QueueTimeout(EngineError):
    """The request waited past the pending deadline (HTTP 503 request_queue_timeout)."""


class ContextLengthExceeded(EngineError):
    """Prompt (plus reserved output) exceeds the context ceiling (HTTP 400)."""

    def __init__(self, prompt_tokens: int, max_context: int) -> None:
        super().__init__(
            f"prompt has {prompt_tokens} tokens but this server's context ceiling is "
            f"{max_context} tokens"
        )
        self.prompt_tokens = prompt_tokens
        self.max_context = max_context


class EngineUnavailable(EngineError):
    """The engine failed as a whole or is shutting down (HTTP 503)."""


@dataclass(slots=True)
class EngineConfig:
    max_concurrency: int = 4  # resident lanes, 1..8
    max_context: int = 0  # per-request ceiling (prompt + output); 0 = the model's own
    prefill_chunk: int = 512
    max_pending_requests: int = 64
    pending_timeout_ms: int = 0  # 0 = wait forever
    threads: int = 0  # CPU threads; 0 = all cores
    mtp_draft_tokens: int = 0  # --spec mtp --draft-tokens; 0 = no MTP drafting
    ngram_draft_tokens: int = 0  # --ngram-draft-tokens; 0 = no n-gram copies
    ngram_min_match: int = 12  # --ngram-min-match
    # --lm-head-draft: MTP drafts score token ids below this only; 0 = the full lm_head
    lm_head_draft_tokens: int = 0
    # --spec-max-batch: no drafting while a step decodes more rows; 0 = no limit, -1 = auto
    spec_max_batch: int = -1
    device: str = "cpu"
    kv_capacity: int = 0  # shared KV pool in tokens; 0 = auto (free memory less the headroom)
    kv_dtype: str = "bf16"  # --kv-dtype: bf16, fp8, int8 or nvfp4
    vram_headroom_mib: int = 1024  # auto sizing leaves this much free
    prefix_reuse: bool = True  # reuse cached prompt prefixes across requests
    # Host tier of the prefix cache: bytes evicted blocks and snapshots share; 0 = none.
    host_context_bytes: int = 0
    snapshot_slots: int = 0  # hybrid: state snapshot slots; 0 = max_concurrency + 1 (+2 w/o host)
    taps_per_request: int = -1  # hybrid: prefill snapshots per request; -1 = 8 (2 w/o host)
    tap_ladder: int = 0  # hybrid: ladder base G; 0 = max(4096, 2 * prefill_chunk)
    tap_min_gap: int = 0  # hybrid: minimum tap spacing; 0 = max(1024, prefill_chunk)
    prefix_cache_file: str | None = None  # restore the cache from it at open, save on close
    cuda_graphs: bool = True  # replay captured CUDA graphs for decode steps (CUDA devices)
    # None: weights come from the artifact. An int: only its header is read and the engine
    # makes seeded random weights on the device (benchmarks of real shapes, no weight file).
    random_weights_seed: int | None = None
    # Ranks the model is split over, Megatron-style (threads of this process on the CPU).
    tensor_parallel_size: int = 1
