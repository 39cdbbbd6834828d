"""bench/bench_guidellm_agreement.py: the scenario it hands GuideLLM and the figures it reads
back from each client's report (GuideLLM's JSON layout of 0.8, bench_serve's result file)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import bench_guidellm_agreement as agreement  # noqa: E402


def _stat(**values):
    return {"successful": values, "errored": {}, "incomplete": {}, "total": values}


def test_scenario_asks_for_the_same_load_as_bench_serve():
    spec = agreement.guidellm_scenario("http://h:1", "m", "/tok", 256, 128, 4, 8)["spec"]
    assert spec["backend"] == {
        "kind": "openai_http",
        "target": "http://h:1",
        "model": "m",
        "request_format": "/v1/chat/completions",
    }
    assert spec["profile"] == {"kind": "concurrent", "streams": 4}
    assert spec["data"] == [{"kind": "synthetic_text", "prompt_tokens": 256, "output_tokens": 128}]
    assert spec["constraints"] == [{"kind": "max_requests", "count": 8}]
    assert spec["tokenizer"]["model"] == "/tok"


def test_guidellm_figures_are_wall_time_rates_and_per_request_latencies():
    report = {
        "benchmarks": [
            {
                "duration": 10.0,
                "metrics": {
                    "output_token_count": _stat(total_sum=1024, count=8, mean=128),
                    "time_to_first_token_ms": _stat(median=80.0, mean=90.0),
                    "inter_token_latency_ms": _stat(mean=20.0, median=19.0),
                    "prompt_token_count": _stat(mean=286.0),
                },
            }
        ]
    }
    assert agreement.guidellm_figures(report) == {
        "output_tok_s": 102.4,
        "median_ttft_ms": 80.0,
        "mean_tpot_ms": 20.0,
        "prompt_tokens": 286.0,
        "completed": 8,
    }


def test_bench_serve_figures_read_the_vllm_named_fields():
    result = {
        "completed": 4,
        "output_throughput": 55.5,
        "median_ttft_ms": 70.0,
        "mean_tpot_ms": 18.0,
        "total_served_prompt_tokens": 1144,
    }
    figures = agreement.bench_serve_figures(result)
    assert figures == {
        "output_tok_s": 55.5,
        "median_ttft_ms": 70.0,
        "mean_tpot_ms": 18.0,
        "prompt_tokens": 286.0,
        "completed": 4,
    }


def test_server_time_per_token_from_two_metrics_pages():
    import bench_guidellm_agreement as agreement

    page = (
        "# TYPE ninfer_request_duration_seconds histogram\n"
        'ninfer_request_duration_seconds_sum{{model="m"}} {d}\n'
        "ninfer_time_to_first_token_seconds_sum {t}\n"
        "ninfer_decode_tokens_total {n}\n"
    )
    before = agreement.metric_values(page.format(d=1.0, t=0.2, n=100))
    after = agreement.metric_values(page.format(d=3.0, t=0.4, n=300))
    # (2.0 s - 0.2 s) over 200 tokens = 9 ms a token
    assert abs(agreement.server_tpot_ms(before, after) - 9.0) < 1e-9
