"""Everything AsyncEngine.open needs from an artifact: header, tokenizer, the token byte
table the core matches stop strings on, the chat template and the native engine itself."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ninfer.artifact import read_header
from ninfer.engine_types import EngineConfig
from ninfer.tokenizer import unicode_to_bytes


@dataclass
class EngineParts:
    core: Any
    tokenizer: Any
    header: dict[str, Any]
    model_info: dict[str, Any]
    chat_template: str | None


def _is_byte_level(document: dict[str, Any]) -> bool:
    def mentions(node: Any) -> bool:
        if isinstance(node, dict):
            return node.get("type") == "ByteLevel" or any(mentions(v) for v in node.values())
        if isinstance(node, list):
            return any(mentions(v) for v in node)
        return False

    return mentions(document.get("decoder")) or mentions(document.get("pre_tokenizer"))


def _piece_bytes(piece: str, byte_level: bool) -> bytes:
    if byte_level:
        table = unicode_to_bytes()
        if all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        return piece.encode()
    # SentencePiece conventions: byte-fallback pieces and the word-boundary marker.
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece.replace("\u2581", " ").encode()


def token_byte_table(tokenizer_json: bytes | str) -> list[bytes]:
    """The bytes each token id stands for (what decoding that single id appends)."""
    document = json.loads(tokenizer_json)
    model = document.get("model") or {}
    vocab = model.get("vocab") or {}
    byte_level = _is_byte_level(document)
    entries: list[tuple[int, bytes]] = []
    if isinstance(vocab, dict):
        entries = [(i, _piece_bytes(p, byte_level)) for p, i in vocab.items()]
    else:  # Unigram: [[piece, score], ...] indexed by position
        entries = [(i, _piece_bytes(item[0], byte_level)) for i, item in enumerate(vocab)]
    for added in document.get("added_tokens") or []:
        entries.append((added["id"], added["content"].encode()))
    size = max((i for i, _ in entries), default=-1) + 1
    table = [b""] * size
    for i, data in entries:
        table[i] = data
    return table


class ArtifactTokenizer:
    """Minimal tokenizer over the artifact's tokenizer.json (HF `tokenizers`)."""

    def __init__(self, tokenizer_json: bytes, header_tokenizer: dict[str, Any]) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_str(tokenizer_json.decode())
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_token_id: int | None = header_tokenizer.get("bos_token_id")
        self.eos_token_ids: list[int] = list(header_tokenizer.get("eos_token_ids") or [])
        self.add_bos_token: bool = bool(header_tokenizer.get("add_bos_token"))

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        # With allow_special False, text such as "<|im_end|>" is tokenized as plain text.
        self._tok.encode_special_tokens = not allow_special
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


def _load_tokenizer(tokenizer_json: bytes, header: dict[str, Any]) -> Any:
    import ninfer.tokenizer as facade

    tokenizer_cls = getattr(facade, "Tokenizer", None)
    if tokenizer_cls is not None and hasattr(tokenizer_cls, "from_json"):
        return tokenizer_cls.from_json(tokenizer_json, header.get("tokenizer") or {})
    return ArtifactTokenizer(tokenizer_json, header.get("tokenizer") or {})


def load_engine_parts(path: Path, config: EngineConfig) -> EngineParts:
    from ninfer import _core
    from ninfer.engine import core_options

    artifact = read_header(path)
    header = artifact.header
    if not artifact.has_resource("tokenizer.json"):
        raise ValueError(f"artifact '{path}' has no tokenizer.json resource")
    tokenizer_json = artifact.resource("tokenizer.json")
    tokenizer = _load_tokenizer(tokenizer_json, header)
    table = token_byte_table(tokenizer_json)
    eos_ids = list((header.get("tokenizer") or {}).get("eos_token_ids") or [])
    core = _core.Engine.open(
        str(path),
        core_options(config, eos_ids),
        table,
        threads=config.threads,
        device=config.device,
    )
    chat_template = None
    if artifact.has_resource("chat_template.jinja"):
        chat_template = artifact.resource("chat_template.jinja").decode()
    info = core.model_info
    cfg = header.get("config") or {}
    model_info = {
        "n_vocab": info["vocab_size"],
        "n_ctx": core.max_context,
        "n_ctx_train": cfg.get("max_position_embeddings") or info["max_position_embeddings"],
        "n_embd": info["hidden_size"],
        "n_params": info["num_params"],
        "size": info["weight_bytes"],
        "ftype": info["weight_format"],
        "architecture": header.get("architecture", info["architecture"]),
        "name": (header.get("metadata") or {}).get("name") or path.stem,
    }
    return EngineParts(core, tokenizer, header, model_info, chat_template)
