"""--request-log-jsonl: append and flush per record, size rotation, refusals at startup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ninfer.server.cli import main
from ninfer.server.request_log import RequestLog, RequestLogError
from ninfer.server.server_start import REDACTED, redacted_argv
from server_harness import free_port

HERE = Path(__file__).resolve().parent

MIB = 1 << 20
PAD = "x" * 20_000  # ~20 KB records: a 1 MiB file rotates after ~52 of them


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _start_record() -> dict:
    return {"event": "server_start", "server_instance_id": "abc", "timestamp_unix_ms": 1}


def test_records_are_appended_and_flushed_one_per_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"event": "earlier"}\n', encoding="utf-8")
    log = RequestLog(path)
    log.start(_start_record())
    log.write({"event": "request_start", "request_id": 1, "ratio": 0.1 + 0.2})
    # flushed: readable before close
    lines = _lines(path)
    assert [line["event"] for line in lines] == ["earlier", "server_start", "request_start"]
    assert lines[2]["ratio"] == 0.1 + 0.2  # full precision
    log.close()


def test_rotation_keeps_k_files_each_starting_with_server_start(tmp_path):
    path = tmp_path / "log.jsonl"
    log = RequestLog(path, max_mib=1, keep=2)
    log.start(_start_record())
    for index in range(250):  # ~5 MiB: four rotations
        log.write({"event": "request_done", "request_id": index, "pad": PAD})
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["log.jsonl", "log.jsonl.1", "log.jsonl.2"]
    start_line = path.read_text(encoding="utf-8").splitlines()[0]
    ids: list[int] = []
    for name in ("log.jsonl.2", "log.jsonl.1", "log.jsonl"):
        text = (tmp_path / name).read_text(encoding="utf-8")
        assert text.splitlines()[0] == start_line  # a verbatim copy in every file
        if name != "log.jsonl":
            # rotated at the record that crossed the limit: over by at most one record
            assert MIB <= len(text.encode()) < MIB + len(PAD) + 200
        ids += [r["request_id"] for r in _lines(tmp_path / name)[1:]]
    assert ids == list(range(ids[0], 250))  # the newest records, in order, none lost in between


def test_keep_zero_deletes_the_full_file(tmp_path):
    path = tmp_path / "log.jsonl"
    log = RequestLog(path, max_mib=1, keep=0)
    log.start(_start_record())
    for index in range(60):
        log.write({"event": "request_done", "request_id": index, "pad": PAD})
    log.close()
    assert [p.name for p in tmp_path.iterdir()] == ["log.jsonl"]
    lines = _lines(path)
    assert lines[0]["event"] == "server_start" and lines[-1]["request_id"] == 59


def test_a_file_already_at_the_limit_is_rotated_before_writing(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"event": "old"}\n' * (MIB // 17 + 1))
    log = RequestLog(path, max_mib=1, keep=4)
    log.start(_start_record())
    log.close()
    assert _lines(path) == [_start_record()]
    assert _lines(tmp_path / "log.jsonl.1")[0] == {"event": "old"}


def test_a_failed_rename_keeps_appending(tmp_path, monkeypatch, caplog):
    path = tmp_path / "log.jsonl"
    log = RequestLog(path, max_mib=1, keep=2)
    log.start(_start_record())

    def refuse(self, target):  # noqa: ANN001
        raise PermissionError(13, "held open by another process")

    monkeypatch.setattr(Path, "rename", refuse)
    for index in range(60):
        log.write({"event": "request_done", "request_id": index, "pad": PAD})
    log.close()
    assert "cannot rotate the request log" in caplog.text
    assert len(_lines(path)) == 61  # everything stayed in the one file


def test_refusals(tmp_path):
    artifact = tmp_path / "model.ninfer"
    artifact.write_bytes(b"x")
    with pytest.raises(RequestLogError, match="model artifact"):
        RequestLog(artifact, artifact=artifact)
    with pytest.raises(RequestLogError, match="model artifact"):  # a rotated name, too
        RequestLog(tmp_path / "model", artifact=tmp_path / "model.1", max_mib=1, keep=2)
    with pytest.raises(RequestLogError, match="does not exist"):
        RequestLog(tmp_path / "missing" / "log.jsonl")
    with pytest.raises(RequestLogError, match="cannot open"):
        RequestLog(tmp_path)  # a directory


def _serve(*flags: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "python"), str(HERE)])
    return subprocess.run(
        [sys.executable, str(HERE / "fake_serve.py"), "--port", str(free_port()), *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_startup_aborts_when_the_log_cannot_be_opened(tmp_path):
    result = _serve("--request-log-jsonl", str(tmp_path / "no" / "f.jsonl"))
    assert result.returncode == 1
    assert "cannot open --request-log-jsonl" in result.stderr and "ready" not in result.stderr
    artifact = tmp_path / "model.ninfer"
    result = _serve(str(artifact), "--request-log-jsonl", str(artifact))
    assert result.returncode == 1
    assert "model artifact" in result.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["--request-log-max-mib", "4"],
        ["--request-log-jsonl", "f", "--request-log-keep", "2"],
        ["--request-log-jsonl", "f", "--request-log-max-mib", "0"],
        ["--request-log-jsonl", "f", "--request-log-max-mib", "1", "--request-log-keep", "1001"],
        ["--log-stats-interval-ms", "-1"],
        ["--log-stats-panel", "maybe"],
        ["--log-colours", "yes"],
    ],
)
def test_bad_logging_flags_abort(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2


def test_argv_redaction():
    argv = ["m", "--api-key", "s3cret", "--api-key=other", "--port", "1"]
    assert redacted_argv(argv) == [
        "m",
        "--api-key",
        REDACTED,
        f"--api-key={REDACTED}",
        "--port",
        "1",
    ]
