"""The ninfer-serve option table, refusals, and model resolution into the cache."""

from __future__ import annotations

import logging
import os
import socket
import sys
import types
from pathlib import Path

import pytest

from ninfer import default_model
from ninfer.default_model import ModelSourceError, cached_conversion, resolve_model, source_kind
from ninfer.engine_loading import apply_cuda_graphs
from ninfer.engine_types import EngineConfig
from ninfer.server.cli import engine_config, main, resolve_device, warmup_shape
from ninfer.server.options import (
    NO_OP_VALUES,
    UNAVAILABLE_OPTIONS,
    build_parser,
    parse_args,
    process_sampling,
)
from ninfer.server.speculative_options import speculative_engine_fields
from server_harness import free_port


@pytest.fixture(autouse=True)
def restore_logging():
    """main() configures process-wide logging; leave it as other tests expect it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


IMPLEMENTED = [
    "--host", "--port", "--api-key", "--model-id", "--chat-template", "--max-context",
    "--max-concurrency", "--max-pending-requests", "--pending-timeout-ms", "--prefill-chunk",
    "--max-request-mib", "--default-max-tokens", "--no-thinking", "--preserve-thinking",
    "--cors", "--log-level", "--device", "--temperature", "--top-p", "--top-k", "--min-p",
    "--presence-penalty", "--frequency-penalty", "--seed", "--greedy", "--usage-chunk-choice",
    "--tolerant-tool-calls", "--reasoning-effort", "--log-stats-interval-ms",
    "--log-stats-panel", "--log-colours", "--request-log-jsonl", "--request-log-max-mib",
    "--request-log-keep", "--response-store-max-records", "--response-store-max-mib",
    "--no-cuda-graph",
    "--load-format", "--kv-dtype",
]  # fmt: skip


def test_help_documents_every_flag_with_its_default(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in IMPLEMENTED + [flag for flag, _, _ in UNAVAILABLE_OPTIONS]:
        assert flag in text, flag
    for action in build_parser()._actions:
        if action.option_strings and action.dest != "help":
            assert "default" in action.help or "not available" in action.help, action.dest


def test_spec_defaults():
    args = parse_args([])
    assert (args.host, args.port, args.max_context, args.max_concurrency) == (
        "127.0.0.1",
        8080,
        8192,
        1,
    )
    assert (args.max_pending_requests, args.pending_timeout_ms, args.prefill_chunk) == (
        16,
        30000,
        1024,
    )
    assert (args.max_request_mib, args.default_max_tokens, args.log_level) == (384, 8192, "info")
    assert args.model is None and args.api_key is None and not args.cors and not args.greedy
    assert process_sampling(args) == {}
    assert (args.log_stats_interval_ms, args.log_stats_panel, args.log_colours) == (
        5000,
        "on",
        "off",
    )
    assert args.request_log_jsonl is None and args.request_log_max_mib is None
    assert args.request_log_keep == 4


@pytest.mark.parametrize(("flag", "takes_value", "feature"), UNAVAILABLE_OPTIONS)
def test_later_feature_flags_are_refused(flag, takes_value, feature, capsys):
    value = "2" if "1" in NO_OP_VALUES.get(flag, ()) else "1"  # a value that asks for it
    argv = [flag, value] if takes_value else [flag]
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["model.ninfer", *argv])
    assert exit_info.value.code == 2
    assert f"{flag} is not available in this build" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--rope-yarn-factor", "1"],
        ["--ngram-archive-mib", "0"],
        ["--vision-offload", "off"],
    ],
)
def test_refused_features_accept_values_that_change_nothing(argv):
    args = parse_args(["model.ninfer", *argv])
    assert args.no_op_options == [" ".join(argv)]
    assert set(NO_OP_VALUES) <= {flag for flag, _, _ in UNAVAILABLE_OPTIONS}


@pytest.mark.parametrize(
    "argv",
    [["--ngram-archive-mib", "8"], ["--rope-yarn-factor", "4"]],
)  # fmt: skip
def test_refused_features_still_refuse_values_that_ask_for_them(argv, capsys):
    with pytest.raises(SystemExit):
        parse_args(["model.ninfer", *argv])
    assert f"{argv[0]} is not available in this build" in capsys.readouterr().err


def test_spec_off_and_zero_ngram_drafts_are_ordinary_values_that_disable_speculation():
    # Served features now: the spec's "off" spellings are plain values, not no-op notices.
    args = parse_args(["model.ninfer", "--spec", "off", "--ngram-draft-tokens", "0"])
    assert args.no_op_options == []
    assert speculative_engine_fields(args) == {
        "mtp_draft_tokens": 0,
        "ngram_draft_tokens": 0,
        "ngram_min_match": 12,
        "spec_max_batch": -1,
        "lm_head_draft_tokens": 0,
    }


def test_no_op_options_are_named_at_startup(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="ninfer.server")
    main([str(tmp_path / "missing.ninfer"), "--rope-yarn-factor", "1", "--log-level", "off"])
    assert "accepted `--rope-yarn-factor 1`" in caplog.text


def test_no_cuda_graph_reaches_the_backend_switch(monkeypatch):
    monkeypatch.delenv("NINFER_CUDA_GRAPHS", raising=False)
    assert engine_config(parse_args(["m.ninfer"])).cuda_graphs is True
    apply_cuda_graphs(engine_config(parse_args(["m.ninfer"])))
    assert "NINFER_CUDA_GRAPHS" not in os.environ  # the operator's environment is left alone
    config = engine_config(parse_args(["m.ninfer", "--no-cuda-graph", "--device", "cpu"]))
    assert config.cuda_graphs is False
    apply_cuda_graphs(config)
    assert os.environ["NINFER_CUDA_GRAPHS"] == "0"
    assert EngineConfig().cuda_graphs is True


@pytest.mark.parametrize(
    "argv",
    [
        ["--bogus"],
        ["--max-concurrency", "9"],
        ["--max-concurrency", "0"],
        ["--port", "70000"],
        ["--temperature", "-1"],
        ["--top-k", "21"],
        ["--top-p", "x"],
        ["--log-level", "loud"],
        ["--device", "gpu"],
        ["--max-con", "2"],  # no abbreviations: a typo must not pick a neighbour
    ],
)
def test_bad_flags_abort(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_flags_reach_engine_config_and_sampling():
    args = parse_args(
        "m.ninfer --max-concurrency 4 --max-context 2048 --prefill-chunk 256 "
        "--max-pending-requests 3 --pending-timeout-ms 500 --device cpu --temperature 0.3 "
        "--top-k 5 --frequency-penalty -1 --seed -9".split()
    )
    config = engine_config(args)
    assert (config.max_concurrency, config.max_context, config.prefill_chunk) == (4, 2048, 256)
    assert (config.max_pending_requests, config.pending_timeout_ms, config.device) == (
        3,
        500,
        "cpu",
    )
    assert process_sampling(args) == {"temperature": 0.3, "top_k": 5, "frequency_penalty": -1.0}
    assert args.seed == -9


def test_device_resolution():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("1") == "cuda:1"
    assert resolve_device(None) in ("cpu", "cuda:0")


def test_missing_model_path_exits_with_message(tmp_path, capsys):
    assert main([str(tmp_path / "absent.ninfer"), "--log-level", "error"]) == 1
    assert "ERROR model path does not exist" in capsys.readouterr().err


def test_missing_chat_template_exits_with_message(tmp_path, capsys):
    model = tmp_path / "m.ninfer"
    model.write_bytes(default_model.ARTIFACT_MAGIC + b"\0" * 24)
    assert main([str(model), "--chat-template", str(tmp_path / "none.jinja")]) == 1
    assert "cannot read --chat-template" in capsys.readouterr().err


def test_source_kinds(tmp_path):
    artifact = tmp_path / "a.bin"
    artifact.write_bytes(default_model.ARTIFACT_MAGIC + b"rest")
    gguf = tmp_path / "b.gguf"
    gguf.write_bytes(b"GGUF\x03\0\0\0")
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    other = tmp_path / "c.txt"
    other.write_text("hello")
    assert [source_kind(p) for p in (artifact, gguf, folder)] == ["ninfer", "gguf", "hf"]
    with pytest.raises(ModelSourceError):
        source_kind(other)
    with pytest.raises(ModelSourceError):
        source_kind(tmp_path)  # a folder without config.json
    assert resolve_model(str(artifact)) == artifact  # served as it is, never copied


def test_embedded_default_is_found():
    path = default_model.embedded_gguf()
    assert path.name.endswith(".gguf") and path.is_file()
    assert source_kind(path) == "gguf"


@pytest.fixture
def fake_converter(monkeypatch):
    calls: list[tuple[Path, Path]] = []

    def convert_source(source, output, *, progress=True, name=None, dtype="keep", generation=None):
        calls.append((Path(source), Path(output)))
        if Path(source).read_bytes().endswith(b"broken"):
            Path(output).write_bytes(b"half")
            raise ValueError("unsupported tensor type")
        Path(output).write_bytes(default_model.ARTIFACT_MAGIC + Path(source).read_bytes())
        return Path(output)

    module = types.ModuleType("ninfer.convert")
    module.convert_source = convert_source
    monkeypatch.setitem(sys.modules, "ninfer.convert", module)
    return calls


def test_conversion_happens_once_and_is_reused(tmp_path, fake_converter):
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF v1")
    cache = tmp_path / "cache"
    first = cached_conversion(source, cache)
    again = cached_conversion(source, cache)
    assert first == again and len(fake_converter) == 1
    assert first.read_bytes() == default_model.ARTIFACT_MAGIC + b"GGUF v1"
    assert sorted(p.name for p in cache.iterdir() if p.suffix == ".ninfer") == [first.name]
    # A changed source (size or mtime) is converted again under a new key.
    source.write_bytes(b"GGUF v2!")
    os.utime(source, ns=(1, 1))
    second = cached_conversion(source, cache)
    assert second != first and len(fake_converter) == 2
    assert second.read_bytes().endswith(b"GGUF v2!")


def test_failed_conversion_leaves_nothing_behind(tmp_path, fake_converter):
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF broken")
    cache = tmp_path / "cache"
    with pytest.raises(ModelSourceError, match="unsupported tensor type"):
        cached_conversion(source, cache)
    assert not [p for p in cache.iterdir() if p.suffix == ".ninfer"]


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path))
    assert default_model.cache_dir() == tmp_path
    monkeypatch.delenv("NINFER_CACHE_DIR")
    assert default_model.cache_dir() == Path.home() / ".cache" / "ninfer"


def test_unloadable_artifact_exits_with_message(tmp_path, capsys):
    pytest.importorskip("ninfer._core")
    model = tmp_path / "broken.ninfer"
    model.write_bytes(default_model.ARTIFACT_MAGIC + b"\0" * 40)
    assert main([str(model), "--port", str(free_port())]) == 1
    assert f"cannot load {model}" in capsys.readouterr().err


def test_busy_port_exits_before_loading(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["--port", str(port)]) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_gpu_warmup_covers_a_whole_prefill_chunk():
    gpu = engine_config(parse_args(["m.ninfer", "--device", "0", "--prefill-chunk", "1024"]))
    assert warmup_shape(gpu) == (1024, 4)
    assert warmup_shape(engine_config(parse_args(["m.ninfer", "--device", "cpu"]))) == (1, 2)
