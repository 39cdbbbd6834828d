"""Round trip of the .ninfer format through the Python writer and both readers, and the
reader's refusal of damaged files."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from ninfer import _core
from ninfer.artifact import (
    ArtifactFormatError,
    ArtifactWriter,
    align_up,
    bf16_bits_to_f32,
    dequantize_q8_0,
    f32_to_bf16_bits,
    quantize_q8_0,
    read_header,
)
from ninfer.artifact.layout import MAGIC, PREAMBLE_SIZE

CONFIG = {"hidden_size": 64, "num_hidden_layers": 1}


def random_tensors(rng: np.random.Generator) -> dict[str, tuple[str, list[int], np.ndarray]]:
    f32 = rng.standard_normal((3, 5), dtype=np.float32)
    return {
        "w.f32": ("f32", [3, 5], f32),
        "w.f16": ("f16", [4, 7], rng.standard_normal((4, 7)).astype(np.float16)),
        "w.bf16": ("bf16", [2, 3, 9], f32_to_bf16_bits(rng.standard_normal((2, 3, 9), np.float32))),
        "w.q8_0": ("q8_0", [6, 64], quantize_q8_0(rng.standard_normal((6, 64), np.float32))),
        "w.i32": ("i32", [11], rng.integers(-(2**31), 2**31 - 1, 11, dtype=np.int32)),
        "w.empty": ("f32", [0, 4], np.zeros((0, 4), np.float32)),
    }


def write_artifact(path: Path, tensors: dict, resources: dict[str, bytes]) -> None:
    writer = ArtifactWriter(
        path, architecture="llama", config=CONFIG, metadata={"name": "tiny ✓"},
        tokenizer={"bos_token_id": 1},
    )
    for name, (dtype, shape, _) in tensors.items():
        writer.declare(name, dtype, shape)
    for name, data in resources.items():
        writer.add_resource(name, data)
    writer.begin()
    for name in reversed(list(tensors)):  # any order: offsets were fixed by the declarations
        writer.write(name, tensors[name][2])
    writer.close()


RESOURCES = {
    "tokenizer.json": json.dumps({"model": {"vocab": {"é": 0}}}, ensure_ascii=False).encode(),
    "chat_template.jinja": b"{% for m in messages %}{{ m.content }}{% endfor %}\n",
    "empty": b"",
    "binary": bytes(range(256)) * 3,
}


@pytest.fixture
def artifact_path(tmp_path: Path) -> tuple[Path, dict]:
    tensors = random_tensors(np.random.default_rng(1234))
    path = tmp_path / "model.ninfer"
    write_artifact(path, tensors, RESOURCES)
    return path, tensors


def test_round_trip_through_core(artifact_path: tuple[Path, dict]) -> None:
    path, tensors = artifact_path
    art = _core.Artifact.open(str(path))
    assert art.architecture == "llama"
    header = json.loads(art.header_json)
    assert header["config"] == CONFIG and header["metadata"]["name"] == "tiny ✓"
    assert art.tensor_names() == list(tensors)
    for name, (dtype, shape, data) in tensors.items():
        view = art.tensor(name)
        assert view.tobytes() == np.ascontiguousarray(data).tobytes(), name
        assert art.tensor_info(name) == {"dtype": dtype, "shape": shape, "nbytes": data.nbytes}
        entry = header["tensors"][name]
        assert entry["offset"] % 256 == 0
        assert entry["quant"] == ({"scheme": "q8_0", "block": 32} if dtype == "q8_0" else None)
    assert art.tensor("w.q8_0").dtype == np.uint8 and art.tensor("w.q8_0").shape == (6, 68)
    assert art.tensor("w.bf16").dtype == np.uint16 and art.tensor("w.bf16").shape == (2, 3, 9)
    assert art.resource_names() == list(RESOURCES)
    for name, data in RESOURCES.items():
        assert art.resource(name) == data
    with pytest.raises(_core.ArtifactError, match="no tensor named 'nope'"):
        art.tensor("nope")
    with pytest.raises(_core.ArtifactError, match="no resource named"):
        art.resource("nope")


def test_core_views_are_zero_copy_read_only_and_keep_the_artifact_alive(
    artifact_path: tuple[Path, dict],
) -> None:
    path, tensors = artifact_path
    art = _core.Artifact.open(str(path))
    view = art.tensor("w.f32")
    again = art.tensor("w.f32")
    assert view.__array_interface__["data"][0] == again.__array_interface__["data"][0]
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0, 0] = 1.0
    del art, again
    np.testing.assert_array_equal(view, tensors["w.f32"][2])  # the mapping must still be alive


def test_python_reader_matches(artifact_path: tuple[Path, dict]) -> None:
    path, tensors = artifact_path
    info = read_header(path)
    assert info.architecture == "llama" and info.config == CONFIG
    header_len = struct.unpack_from("<Q", path.read_bytes(), 16)[0]
    assert info.data_offset == align_up(PREAMBLE_SIZE + header_len)
    for name, data in RESOURCES.items():
        assert info.resource(name) == data
    for name, (dtype, _, data) in tensors.items():
        assert info.tensor_bytes(name).tobytes() == np.ascontiguousarray(data).tobytes()
        np.testing.assert_array_equal(info.tensor(name), data)
        if dtype == "bf16":
            np.testing.assert_array_equal(info.tensor_f32(name), bf16_bits_to_f32(data))
        elif dtype == "q8_0":
            np.testing.assert_array_equal(info.tensor_f32(name), dequantize_q8_0(data, [6, 64]))
        else:
            np.testing.assert_array_equal(info.tensor_f32(name), data.astype(np.float32))


def test_bf16_rounding_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(7).standard_normal(10_000).astype(np.float32) * 1e3
    x[:4] = [np.inf, -np.inf, 0.0, -0.0]
    expected = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(f32_to_bf16_bits(x), expected)
    np.testing.assert_array_equal(bf16_bits_to_f32(expected), torch.from_numpy(x).to(
        torch.bfloat16).float().numpy())


def test_writer_refuses_mismatched_data(tmp_path: Path) -> None:
    writer = ArtifactWriter(tmp_path / "x.ninfer", architecture="llama", config={})
    writer.declare("a", "f32", [2, 2])
    with pytest.raises(ValueError, match="divisible by 32"):
        writer.declare("b", "q8_0", [2, 33])
    writer.begin()
    with pytest.raises(TypeError, match="expected numpy float32"):
        writer.write("a", np.zeros((2, 2), np.float64))
    with pytest.raises(ValueError, match="needs 16"):
        writer.write("a", b"\0" * 12)
    writer.write_part("a", b"\0" * 12)
    with pytest.raises(ValueError, match="more than its 16 bytes"):
        writer.write_part("a", b"\0" * 8)
    with pytest.raises(ValueError, match="not fully written"):
        writer.close()
    assert not (tmp_path / "x.ninfer").exists() and not (tmp_path / "x.ninfer.partial").exists()


# -- damaged files --------------------------------------------------------------------------


def craft(path: Path, header: dict | bytes, *, data: bytes = b"", magic: bytes = MAGIC,
          version: int = 1, crc: int | None = None) -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    preamble = struct.pack("<8sIIQII", magic, version, 0, len(raw),
                           zlib.crc32(raw) if crc is None else crc, 0)
    padding = b"\0" * (align_up(PREAMBLE_SIZE + len(raw)) - PREAMBLE_SIZE - len(raw))
    path.write_bytes(preamble + raw + padding + data)
    return path


def base_header(**overrides: object) -> dict:
    header = {
        "format_version": 1, "architecture": "llama", "config": {},
        "tensors": {"t": {"dtype": "f32", "shape": [4], "offset": 0, "nbytes": 16}},
        "resources": {"r": {"offset": 256, "size": 3}}, "data_size": 259,
    }
    header.update(overrides)
    return header


def expect_refusal(path: Path, pattern: str) -> None:
    with pytest.raises(_core.ArtifactError, match=pattern) as core_error:
        _core.Artifact.open(str(path))
    assert str(path) in str(core_error.value)
    assert isinstance(core_error.value, ValueError)


GOOD_DATA = b"\1" * 256 + b"abc"


def test_crafted_file_is_accepted(tmp_path: Path) -> None:
    art = _core.Artifact.open(str(craft(tmp_path / "ok.ninfer", base_header(), data=GOOD_DATA)))
    assert art.resource("r") == b"abc"


def test_truncated_file(tmp_path: Path, artifact_path: tuple[Path, dict]) -> None:
    path, _ = artifact_path
    cut = tmp_path / "cut.ninfer"
    cut.write_bytes(path.read_bytes()[:-10])
    expect_refusal(cut, "file too short.*truncated")
    with pytest.raises(ArtifactFormatError, match="file too short"):
        read_header(cut)
    tiny = tmp_path / "tiny.ninfer"
    tiny.write_bytes(MAGIC)
    expect_refusal(tiny, "file too short")
    empty = tmp_path / "empty.ninfer"
    empty.write_bytes(b"")
    expect_refusal(empty, "file too short")
    header_cut = tmp_path / "header_cut.ninfer"
    header_cut.write_bytes(path.read_bytes()[:100])
    expect_refusal(header_cut, "header of .* extends past the end")


def test_missing_file(tmp_path: Path) -> None:
    expect_refusal(tmp_path / "absent.ninfer", "cannot open")


def test_wrong_magic(tmp_path: Path) -> None:
    path = craft(tmp_path / "m.ninfer", base_header(), data=GOOD_DATA, magic=b"GGUF\0\0\0\0")
    expect_refusal(path, "wrong magic")
    with pytest.raises(ArtifactFormatError, match="wrong magic"):
        read_header(path)


def test_unknown_version(tmp_path: Path) -> None:
    path = craft(tmp_path / "v.ninfer", base_header(), data=GOOD_DATA, version=7)
    expect_refusal(path, "unknown format version 7")
    with pytest.raises(ArtifactFormatError, match="unknown format version 7"):
        read_header(path)


def test_corrupted_header_byte(tmp_path: Path, artifact_path: tuple[Path, dict]) -> None:
    path, _ = artifact_path
    raw = bytearray(path.read_bytes())
    raw[PREAMBLE_SIZE + 40] ^= 0x20
    bad = tmp_path / "flip.ninfer"
    bad.write_bytes(bytes(raw))
    expect_refusal(bad, "CRC-32 mismatch")
    with pytest.raises(ArtifactFormatError, match="CRC-32 mismatch"):
        read_header(bad)


def test_malformed_json(tmp_path: Path) -> None:
    for i, text in enumerate([b'{"a": 1,}', b'{"a": tru}', b'{"a": "\\x"}', b"[1, 2", b"{} {}",
                              b'{"a": 01}', b'{"a": "\\ud800"}', b"\xff"]):
        expect_refusal(craft(tmp_path / f"j{i}.ninfer", text), "malformed header JSON")


def test_json_escapes_decode(tmp_path: Path) -> None:
    name = 'w"\\/\t é 𝄞 \u0001'
    header = base_header(tensors={name: {"dtype": "f32", "shape": [4], "offset": 0, "nbytes": 16}})
    raw = json.dumps(header, ensure_ascii=True).encode()  # \uXXXX escapes incl. a surrogate pair
    art = _core.Artifact.open(str(craft(tmp_path / "esc.ninfer", raw, data=GOOD_DATA)))
    assert art.tensor_names() == [name]


def test_extent_outside_data_section(tmp_path: Path) -> None:
    tensors = {"t": {"dtype": "f32", "shape": [4], "offset": 256, "nbytes": 16}}
    expect_refusal(craft(tmp_path / "a.ninfer", base_header(tensors=tensors), data=GOOD_DATA),
                   "tensor 't' .* outside the data section")
    resources = {"r": {"offset": 256, "size": 4}}
    expect_refusal(craft(tmp_path / "b.ninfer", base_header(resources=resources), data=GOOD_DATA),
                   "resource 'r' .* outside the data section")
    huge = {"r": {"offset": 256, "size": 2**62}}
    expect_refusal(craft(tmp_path / "c.ninfer", base_header(resources=huge), data=GOOD_DATA),
                   "outside the data section")
    expect_refusal(craft(tmp_path / "d.ninfer", base_header(data_size=10**6), data=GOOD_DATA),
                   "file too short: data section")


def test_shape_disagrees_with_nbytes(tmp_path: Path) -> None:
    tensors = {"t": {"dtype": "bf16", "shape": [4], "offset": 0, "nbytes": 16}}
    expect_refusal(craft(tmp_path / "a.ninfer", base_header(tensors=tensors), data=GOOD_DATA),
                   "tensor 't' has nbytes 16 but its shape and dtype bf16 need 8")
    tensors = {"t": {"dtype": "q8_0", "shape": [1, 48], "offset": 0, "nbytes": 34}}
    expect_refusal(craft(tmp_path / "b.ninfer", base_header(tensors=tensors), data=GOOD_DATA),
                   "not a multiple of 32")
    tensors = {"t": {"dtype": "f64", "shape": [2], "offset": 0, "nbytes": 16}}
    expect_refusal(craft(tmp_path / "c.ninfer", base_header(tensors=tensors), data=GOOD_DATA),
                   "unknown tensor dtype 'f64'")
    tensors = {"t": {"dtype": "f32", "shape": [-4], "offset": 0, "nbytes": 16}}
    expect_refusal(craft(tmp_path / "d.ninfer", base_header(tensors=tensors), data=GOOD_DATA),
                   "must not be negative")
    tensors = {"t": {"dtype": "f32", "shape": [4], "offset": 8, "nbytes": 16}}
    expect_refusal(craft(tmp_path / "e.ninfer", base_header(tensors=tensors), data=GOOD_DATA),
                   "not 256-byte aligned")
    with pytest.raises(ArtifactFormatError, match="not 256-byte aligned"):
        read_header(tmp_path / "e.ninfer")
    tensors = {"t": {"dtype": "f32", "shape": [2**40, 2**40], "offset": 0, "nbytes": 16}}
    expect_refusal(craft(tmp_path / "f.ninfer", base_header(tensors=tensors), data=GOOD_DATA),
                   "too large")


def test_header_without_required_fields(tmp_path: Path) -> None:
    expect_refusal(craft(tmp_path / "a.ninfer", base_header(architecture=3), data=GOOD_DATA),
                   "architecture")
    expect_refusal(craft(tmp_path / "b.ninfer", b"[1]"), "not an object")
    header = base_header()
    del header["data_size"]
    expect_refusal(craft(tmp_path / "c.ninfer", header, data=GOOD_DATA), "data_size")


def test_mangled_headers_never_crash(tmp_path: Path, artifact_path: tuple[Path, dict]) -> None:
    """Cut or corrupt the header JSON at many places (with a valid CRC): always a clean error."""
    path, _ = artifact_path
    raw = path.read_bytes()
    header_len = struct.unpack_from("<Q", raw, 16)[0]
    header = raw[PREAMBLE_SIZE:PREAMBLE_SIZE + header_len]
    rng = np.random.default_rng(99)
    candidates = [header[:cut] for cut in rng.integers(0, header_len, 40)]
    for _ in range(60):
        mangled = bytearray(header)
        mangled[rng.integers(0, header_len)] = int(rng.choice(list(b'{}[]",:0-9e.tfn\\ \x00\xff')))
        candidates.append(bytes(mangled))
    data = raw[align_up(PREAMBLE_SIZE + header_len):]
    refused = 0
    for i, candidate in enumerate(candidates):
        bad = craft(tmp_path / f"m{i}.ninfer", candidate, data=data)
        try:
            _core.Artifact.open(str(bad))
        except _core.ArtifactError:  # any other exception type fails the test
            refused += 1
    assert refused >= 40  # every truncation at least
