"""Header sections shared by all converters: metadata, generation defaults, tokenizer facts."""

from __future__ import annotations

import datetime
from typing import Any

import ninfer

# Sampling defaults worth carrying from generation_config.json (ids go to the tokenizer section).
GENERATION_KEYS = (
    "do_sample",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "typical_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "max_new_tokens",
)


def metadata(name: str, source: str, *, created: str | None = "now") -> dict[str, Any]:
    if created == "now":
        created = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "name": name,
        "source": source,
        "converter": f"ninfer-convert {ninfer.__version__}",
        "created": created,
    }


def generation_defaults(generation_config: dict[str, Any]) -> dict[str, Any]:
    return {k: generation_config[k] for k in GENERATION_KEYS if k in generation_config}


def _id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)]


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):  # tokenizer_config.json may spell tokens as AddedToken dicts
        return value.get("content")
    return value


def token_ids_by_content(tokenizer_json: dict[str, Any]) -> dict[str, int]:
    ids: dict[str, int] = {}
    vocab = (tokenizer_json.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        ids.update(vocab)
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        ids.update({piece: i for i, (piece, _) in enumerate(vocab)})
    for token in tokenizer_json.get("added_tokens") or []:
        ids[token["content"]] = token["id"]
    return ids


def _post_processor_adds(tokenizer_json: dict[str, Any], token: str | None) -> bool:
    """True when tokenizer.json's post-processor prepends `token` to single sequences."""
    if token is None:
        return False
    processor = tokenizer_json.get("post_processor") or {}
    candidates = (
        processor.get("processors", []) if processor.get("type") == "Sequence" else [processor]
    )
    for candidate in candidates:
        if candidate.get("type") == "TemplateProcessing":
            single = candidate.get("single") or []
            if single and single[0].get("SpecialToken", {}).get("id") == token:
                return True
    return False


def tokenizer_section(
    tokenizer_json: dict[str, Any],
    tokenizer_config: dict[str, Any],
    hf_config: dict[str, Any],
    generation_config: dict[str, Any],
) -> dict[str, Any]:
    """{bos_token, eos_token, bos_token_id, eos_token_ids, pad_token_id, add_bos_token}."""
    ids = token_ids_by_content(tokenizer_json)
    bos = _token_content(tokenizer_config.get("bos_token"))
    eos = _token_content(tokenizer_config.get("eos_token"))
    pad = _token_content(tokenizer_config.get("pad_token"))

    bos_id = hf_config.get("bos_token_id")
    if bos_id is None:
        bos_id = generation_config.get("bos_token_id")
    if bos_id is None and bos is not None:
        bos_id = ids.get(bos)
    eos_ids: list[int] = []
    for candidate in (
        *_id_list(hf_config.get("eos_token_id")),
        *_id_list(generation_config.get("eos_token_id")),
        *([ids[eos]] if eos in ids else []),
    ):
        if candidate not in eos_ids:
            eos_ids.append(candidate)
    pad_id = generation_config.get("pad_token_id", hf_config.get("pad_token_id"))
    if pad_id is None and pad is not None:
        pad_id = ids.get(pad)
    if isinstance(pad_id, list):
        pad_id = pad_id[0] if pad_id else None
    if bos is None and bos_id is not None:
        bos = next((content for content, i in ids.items() if i == bos_id), None)
    if eos is None and eos_ids:
        eos = next((content for content, i in ids.items() if i == eos_ids[0]), None)
    add_bos = tokenizer_config.get("add_bos_token")
    if add_bos is None:
        add_bos = _post_processor_adds(tokenizer_json, bos)
    return {
        "bos_token": bos,
        "eos_token": eos,
        "bos_token_id": None if bos_id is None else int(bos_id),
        "eos_token_ids": eos_ids,
        "pad_token_id": None if pad_id is None else int(pad_id),
        "add_bos_token": bool(add_bos),
    }
