"""Wire struct of a legacy Completions request, and its lowering to a GenerationRequest.

The prompt is a string or token ids (a one-element list of either is the same prompt); it
is encoded as is, without a chat template. `max_tokens` <= 0 means "no client limit": the
output may run to the context ceiling. Output is plain text: no reasoning or tool channels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from ninfer.engine_types import GenerationRequest
from ninfer.protocols.generation_fields import GenerationFields, Int64, check_mm_processor_kwargs
from ninfer.protocols.openai_chat.lowering import check_model, stop_strings, stop_token_ids
from ninfer.protocols.served_model import ServedModel
from ninfer.server.errors import context_length_exceeded, invalid, unsupported


class CompletionRequest(GenerationFields, kw_only=True):
    prompt: str | list[Any]
    max_tokens: Int64 | None = None  # <= 0: no client limit
    best_of: Int64 | None = None
    logprobs: Int64 | None = None
    echo: bool | None = None
    suffix: str | None = None


def decode_completion_request(body: bytes) -> CompletionRequest:
    return msgspec.json.decode(body, type=CompletionRequest)


@dataclass(slots=True)
class LoweredCompletion:
    generation: GenerationRequest
    stream: bool
    include_usage: bool
    return_token_ids: bool

    @property
    def prompt_tokens(self) -> int:
        return len(self.generation.prompt_ids)


def lower_completion_request(request: CompletionRequest, served: ServedModel) -> LoweredCompletion:
    check_model(request.model, served.public_id)
    _reject_unsupported(request)
    if request.stream_options is not None and not request.stream:
        raise invalid("`stream_options` is only allowed when `stream` is true", "stream_options")
    prompt_ids = prompt_token_ids(request.prompt, served)
    generation = GenerationRequest(
        prompt_ids=prompt_ids,
        max_tokens=_max_tokens(request.max_tokens, len(prompt_ids), served),
        sampling=served.sampling.resolve(
            request.sampling_fields(),
            request.seed,
        ),
        stop_strings=stop_strings(request.stop),
        stop_token_ids=stop_token_ids(request.stop_token_ids, served),
        ignore_eos=bool(request.ignore_eos),
        min_tokens=request.min_tokens or 0,
    )
    return LoweredCompletion(
        generation,
        stream=bool(request.stream),
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        return_token_ids=bool(request.return_token_ids),
    )


def prompt_token_ids(prompt: str | list[Any], served: ServedModel) -> list[int]:
    """A string (encoded with control tokens allowed, BOS added when the tokenizer asks for
    it) or token ids; a one-element list of either is the same prompt."""
    if isinstance(prompt, list):
        if not prompt:
            raise invalid("`prompt` must not be empty", "prompt")
        if all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            return _checked_ids(prompt, served, "prompt")
        if len(prompt) > 1:
            raise unsupported("prompt", "one prompt per request (batched prompts are not served)")
        only = prompt[0]
        if isinstance(only, str):
            prompt = only
        elif isinstance(only, list) and all(
            isinstance(x, int) and not isinstance(x, bool) for x in only
        ):
            return _checked_ids(only, served, "prompt[0]")
        else:
            raise invalid(
                "`prompt` must be a string or a list of token ids", "prompt", "invalid_type"
            )
    tokenizer = served.engine.tokenizer
    ids = tokenizer.encode(prompt, allow_special=True)
    bos = getattr(tokenizer, "bos_token_id", None)
    if getattr(tokenizer, "add_bos_token", False) and bos is not None and ids[:1] != [bos]:
        ids = [bos, *ids]
    if not ids:
        raise invalid("`prompt` encodes to no tokens", "prompt")
    return ids


def _checked_ids(ids: list[int], served: ServedModel, where: str) -> list[int]:
    if not ids:
        raise invalid("`prompt` must not be empty", where)
    vocab = int(served.engine.model_info.get("n_vocab") or 0)
    for i, token in enumerate(ids):
        if token < 0 or (vocab and token >= vocab):
            raise invalid(
                f"token id {token} is outside the vocabulary (size {vocab})", f"{where}[{i}]"
            )
    return list(ids)


def _max_tokens(asked: int | None, prompt_tokens: int, served: ServedModel) -> int:
    ceiling = served.max_context
    if prompt_tokens >= ceiling:
        raise context_length_exceeded(prompt_tokens, ceiling, param="prompt")
    room = ceiling - prompt_tokens
    if asked is None:
        return served.cap_output(min(served.default_max_tokens, room))
    return served.cap_output(room if asked <= 0 else min(asked, room))


def _reject_unsupported(request: CompletionRequest) -> None:
    if request.n not in (None, 1):
        raise unsupported("n", "this server generates exactly one choice per request (n: 1)")
    if request.best_of not in (None, 1):
        raise unsupported("best_of", "one candidate is generated per request (best_of: 1)")
    if request.logprobs:
        raise unsupported("logprobs", "log probabilities are not reported by this build")
    if request.echo:
        raise unsupported("echo", "the prompt is not echoed into the completion")
    if request.suffix:
        raise unsupported("suffix", "insertion (suffix) completion is not served")
    if request.logit_bias and any(v != 0 for v in request.logit_bias.values()):
        raise unsupported("logit_bias", "logit biases are not applied to the sampler")
    if request.repetition_penalty not in (None, 1, 1.0):
        raise unsupported("repetition_penalty", "only the neutral value 1 is accepted")
    check_mm_processor_kwargs(request.mm_processor_kwargs)
