"""The ninfer-convert command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ninfer import _core
from ninfer.convert.cli import main

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "vocab_size": 512,
}


def test_random_then_reconvert_refusal(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    out = tmp_path / "r.ninfer"
    assert (
        main(
            [
                "--random",
                str(config),
                "--seed",
                "3",
                "--dtype",
                "q8_0",
                "--name",
                "tiny",
                "-o",
                str(out),
                "-q",
            ]
        )
        == 0
    )
    art = _core.Artifact.open(str(out))
    assert json.loads(art.header_json)["metadata"]["name"] == "tiny"
    assert art.tensor_info("model.layers.0.mlp.up_proj.weight")["dtype"] == "q8_0"
    assert "wrote" in capsys.readouterr().out
    # an artifact as SOURCE is accepted as is, but cannot be re-encoded
    assert main([str(out), "-o", str(tmp_path / "copy.ninfer"), "-q"]) == 0
    assert main([str(out), "-o", str(tmp_path / "copy.ninfer"), "--dtype", "bf16", "-q"]) == 1
    assert "cannot be re-encoded" in capsys.readouterr().err


def test_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(tmp_path / "missing"), "-o", str(tmp_path / "x.ninfer"), "-q"]) == 1
    assert "no such model source" in capsys.readouterr().err
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps(dict(CONFIG, architectures=["BertModel"])))
    assert main(["--random", str(bad), "-o", str(tmp_path / "x.ninfer"), "-q"]) == 1
    assert "unsupported architecture" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["-o", str(tmp_path / "x.ninfer")])
