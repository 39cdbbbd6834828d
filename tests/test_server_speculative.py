"""Speculative decoding through the server: the flags of ninfer-serve, and a random-weight
Qwen3.5 model with an MTP head served with --spec mtp plus n-gram drafting, whose greedy
answers over Chat Completions (aggregate and streamed, through the openai SDK), the legacy
completions endpoint and Anthropic Messages equal those of a server without speculation, with
the same usage; the llama.cpp-style timings carry draft_n / draft_n_accepted."""

from __future__ import annotations

import pytest

from metrics_scrape import scrape
from ninfer.engine_types import EngineConfig
from ninfer.server.cli import engine_config
from ninfer.server.options import parse_args
from server_harness import start_server

_core = pytest.importorskip("ninfer._core")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.engine import AsyncEngine  # noqa: E402

MODEL = "tiny-mtp"
CONFIG = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=64,
    intermediate_size=96, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=1,
    head_dim=32, linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16,
    linear_value_head_dim=16, vocab_size=400, mtp_num_hidden_layers=1,
)  # fmt: skip
PROMPTS = [
    "Write a haiku about the sea.",
    "Repeat after me: one two three, one two three, one two three, one two three.",
]


# --- flags ------------------------------------------------------------------------------


def test_spec_flags_select_the_engine_drafters():
    args = parse_args(["m.ninfer", "--spec", "mtp", "--draft-tokens", "2", "--ngram-draft-tokens",
                       "8", "--ngram-min-match", "6"])  # fmt: skip
    config = engine_config(args)
    assert (config.mtp_draft_tokens, config.ngram_draft_tokens, config.ngram_min_match) == (2, 8, 6)
    assert engine_config(parse_args(["m.ninfer", "--spec", "mtp"])).mtp_draft_tokens == 3
    plain = engine_config(parse_args(["m.ninfer"]))
    assert (plain.mtp_draft_tokens, plain.ngram_draft_tokens) == (0, 0)
    ngram_only = engine_config(parse_args(["m.ninfer", "--ngram-draft-tokens", "4"]))
    assert (ngram_only.mtp_draft_tokens, ngram_only.ngram_draft_tokens) == (0, 4)


def test_lm_head_draft_selects_the_proposal_head_size():
    args = parse_args(["m.ninfer", "--spec", "mtp", "--lm-head-draft"])
    assert engine_config(args).lm_head_draft_tokens == 32768
    args = parse_args(
        ["m.ninfer", "--spec", "mtp", "--lm-head-draft", "--lm-head-draft-tokens", "256"]
    )
    assert engine_config(args).lm_head_draft_tokens == 256
    assert engine_config(parse_args(["m.ninfer", "--spec", "mtp"])).lm_head_draft_tokens == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--spec", "dflash"], "--spec dflash is not available in this build"),
        (["--spec", "dflash2", "--draft-tokens", "7"], "--spec dflash2 is not available"),
        (["--spec", "eagle"], "invalid choice: 'eagle'"),
        (["--draft-tokens", "3"], "--draft-tokens requires --spec"),
        (["--spec", "mtp", "--draft-tokens", "6"], "--draft-tokens must be 1..5"),
        (["--spec", "mtp", "--draft-tokens", "0"], "--draft-tokens must be 1..5"),
        (["--ngram-draft-tokens", "64"], "--ngram-draft-tokens must be 0..63"),
        (["--ngram-min-match", "3"], "--ngram-min-match must be 4..64"),
        (["--ngram-draft-tokens", "4", "--ngram-archive-mib", "64"],
         "--ngram-archive-mib is not available in this build"),
        (["--lm-head-draft"], "--lm-head-draft drafts for the MTP head: it requires --spec mtp"),
        (["--spec", "mtp", "--lm-head-draft-tokens", "256"],
         "--lm-head-draft-tokens requires --lm-head-draft"),
        (["--spec", "mtp", "--lm-head-draft", "--lm-head-draft-tokens", "1000"],
         "--lm-head-draft-tokens must be a positive multiple of 128, got 1000"),
        (["--spec", "mtp", "--lm-head-draft", "--lm-head-draft-tokens", "0"],
         "--lm-head-draft-tokens must be a positive multiple of 128"),
    ],
)  # fmt: skip
def test_bad_spec_flags_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["m.ninfer", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_mtp_on_an_artifact_without_a_head_fails_at_load(tmp_path):
    path = make_random_artifact(dict(CONFIG, mtp_num_hidden_layers=0), tmp_path / "a.ninfer",
                                seed=1, dtype="f32", tokenizer="synthetic")  # fmt: skip
    with pytest.raises(ValueError, match="--spec mtp needs a model with an MTP head"):
        AsyncEngine.open(path, EngineConfig(max_context=256, threads=1, mtp_draft_tokens=2))


# --- served ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    path = make_random_artifact(CONFIG, tmp_path_factory.mktemp("art") / "mtp.ninfer", seed=3,
                                dtype="f32", tokenizer="synthetic", name=MODEL)  # fmt: skip
    base = dict(max_concurrency=2, max_context=512, prefill_chunk=32, threads=1)
    plain = start_server(AsyncEngine.open(path, EngineConfig(**base)), default_max_tokens=24)
    spec_config = EngineConfig(**base, mtp_draft_tokens=3, ngram_draft_tokens=6, ngram_min_match=4)
    spec = start_server(AsyncEngine.open(path, spec_config), default_max_tokens=24)
    yield plain, spec
    plain.stop()
    spec.stop()


def _chat(server, prompt: str, **kw):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x")
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=20,
        temperature=0, extra_body={"ignore_eos": True}, **kw,
    )  # fmt: skip


def test_chat_answers_and_usage_equal_plain_decoding(servers):
    plain, spec = servers
    for prompt in PROMPTS:
        a, b = _chat(plain, prompt), _chat(spec, prompt)
        assert b.choices[0].message.content == a.choices[0].message.content
        assert b.usage.model_dump() == a.usage.model_dump()
        assert b.choices[0].finish_reason == a.choices[0].finish_reason == "length"
        timings = b.model_extra["timings"]
        assert timings["draft_n"] > 0 and 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
        assert "draft_n" not in a.model_extra["timings"]


def test_streamed_chat_equals_plain_decoding(servers):
    def streamed(server):
        chunks = _chat(server, PROMPTS[0], stream=True, stream_options={"include_usage": True})
        text, usage, reason = [], None, None
        for chunk in chunks:
            if chunk.usage:
                usage = chunk.usage.model_dump()
            for choice in chunk.choices:
                delta = choice.delta
                text.append((delta.content or "") + (getattr(delta, "reasoning_content", "") or ""))
                reason = choice.finish_reason or reason
        return "".join(text), usage, reason

    plain, spec = servers
    assert streamed(spec) == streamed(plain)


def _complete(server, **kw):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x")
    return client.completions.create(model=MODEL, prompt=PROMPTS[1], temperature=0, **kw)


def test_a_stop_string_inside_a_round_ends_like_plain_decoding(servers):
    plain, spec = servers
    reference = _complete(plain, max_tokens=24).choices[0].text
    assert len(reference) > 8
    for cut in (3, len(reference) // 2, len(reference) - 3):
        stop = reference[cut : cut + 2]
        a, b = (
            _complete(plain, max_tokens=24, stop=[stop]),
            _complete(spec, max_tokens=24, stop=[stop]),
        )
        assert b.choices[0].text == a.choices[0].text
        assert b.choices[0].finish_reason == a.choices[0].finish_reason
        assert b.usage.model_dump() == a.usage.model_dump()
    for max_tokens in (1, 2, 5, 11):
        a, b = _complete(plain, max_tokens=max_tokens), _complete(spec, max_tokens=max_tokens)
        assert b.choices[0].text == a.choices[0].text
        assert b.usage.completion_tokens == a.usage.completion_tokens == max_tokens


def test_completions_and_anthropic_messages_equal_plain_decoding(servers):
    plain, spec = servers
    answers = []
    for server in servers:
        client = anthropic.Anthropic(base_url=server.base_url, api_key="x")
        message = client.messages.create(
            model=MODEL, max_tokens=16, extra_body={"temperature": 0},
            messages=[{"role": "user", "content": PROMPTS[1]}],
        )  # fmt: skip
        completion = _complete(server, max_tokens=16)
        answers.append(
            ([b.model_dump() for b in message.content], message.usage.model_dump(),
             message.stop_reason, completion.choices[0].text, completion.usage.model_dump())
        )  # fmt: skip
    assert answers[1] == answers[0]
    assert spec.engine.stats()["spec_rounds"] > 0


def test_metrics_count_speculative_work(servers):
    plain, spec = servers
    _chat(spec, PROMPTS[0])
    stats = spec.engine.stats()
    got = scrape(spec.base_url)
    rounds = got.value("ninfer_spec_decode_rounds_total")
    drafted = got.value("ninfer_spec_decode_draft_tokens_total")
    accepted = got.value("ninfer_spec_decode_accepted_tokens_total")
    assert 0 < rounds <= stats["spec_rounds"]
    assert rounds <= drafted <= 6 * rounds
    assert 0 <= accepted <= drafted
    assert got.value("ninfer_spec_decode_fallback_steps_total") >= 0
    assert scrape(plain.base_url).value("ninfer_spec_decode_rounds_total") == 0


def test_json_schema_response_format_equals_plain_decoding(servers):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
        "required": ["name", "n"],
    }

    def ask(server):
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x")
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=40,
            temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
        )  # fmt: skip

    plain, spec = servers
    a, b = ask(plain), ask(spec)
    assert b.choices[0].message.content == a.choices[0].message.content
    assert b.choices[0].finish_reason == a.choices[0].finish_reason
    assert b.usage.model_dump() == a.usage.model_dump()


def test_a_repeated_long_prompt_hits_the_prefix_cache_as_without_speculation(servers):
    question = "Count from one to twenty in words, separated by commas. " * 4

    def chat(server):
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x")
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=40,
            temperature=0, extra_body={"ignore_eos": True},
        )  # fmt: skip

    plain, spec = servers
    (a1, a2), (b1, b2) = (chat(plain), chat(plain)), (chat(spec), chat(spec))
    for a, b in ((a1, b1), (a2, b2)):
        assert b.choices[0].message.content == a.choices[0].message.content
        assert b.usage.model_dump() == a.usage.model_dump()
    # The second request resumes from the first one's prompt-end snapshot.
    assert b2.usage.prompt_tokens_details.cached_tokens >= 64
    assert b2.model_extra["timings"]["draft_n"] > 0


def test_responses_api_equals_plain_decoding(servers):
    def respond(server):
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x")
        response = client.responses.create(
            model=MODEL, input=PROMPTS[1], max_output_tokens=24, temperature=0, store=False
        )
        return response.output_text, response.usage.model_dump(), response.status

    plain, spec = servers
    assert respond(spec) == respond(plain)


# --- the proposal head, through the three protocols' SDKs, streamed --------------------


# A prompt no other test sends: both servers' prefix caches start cold on it, so cached_tokens
# agree as well.
DRAFT_PROMPT = "List the planets, then the planets again in reverse order, then once more."


@pytest.fixture(scope="module")
def draft_server(servers, tmp_path_factory):
    path = make_random_artifact(CONFIG, tmp_path_factory.mktemp("art") / "mtp.ninfer", seed=3,
                                dtype="f32", tokenizer="synthetic", name=MODEL)  # fmt: skip
    config = EngineConfig(max_concurrency=2, max_context=512, prefill_chunk=32, threads=1,
                          mtp_draft_tokens=3, lm_head_draft_tokens=128)  # fmt: skip
    server = start_server(AsyncEngine.open(path, config), default_max_tokens=24)
    yield server
    server.stop()


def _streamed_chat(server):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x")
    chunks = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": DRAFT_PROMPT}], max_tokens=20,
        temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    text, usage, reasons = [], None, []
    for chunk in chunks:
        usage = chunk.usage.model_dump() if chunk.usage else usage
        for choice in chunk.choices:
            text.append(
                (choice.delta.content or "")
                + (getattr(choice.delta, "reasoning_content", "") or "")
            )
            reasons.append(choice.finish_reason)
    return "".join(text), usage, [r for r in reasons if r]


def _streamed_response(server):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x")
    events = list(client.responses.create(model=MODEL, input=DRAFT_PROMPT, max_output_tokens=20,
                                          temperature=0, store=False, stream=True))  # fmt: skip
    done = events[-1]
    assert done.type == "response.incomplete"  # max_output_tokens ends it
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == done.response.output_text
    return [e.type for e in events], done.response.output_text, done.response.usage.model_dump()


def _streamed_message(server):
    client = anthropic.Anthropic(base_url=server.base_url, api_key="x")
    with client.messages.stream(
        model=MODEL, max_tokens=20, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": DRAFT_PROMPT}],
    ) as stream:  # fmt: skip
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    return (
        kinds,
        [b.model_dump() for b in final.content],
        final.usage.model_dump(),
        final.stop_reason,
    )


def test_the_proposal_head_serves_all_three_protocols_like_plain_decoding(servers, draft_server):
    plain, _ = servers
    for ask in (_streamed_chat, _streamed_response, _streamed_message):
        assert ask(draft_server) == ask(plain), ask.__name__
    stats = draft_server.engine.stats()
    assert stats["spec_rounds"] > 0 and stats["spec_draft_tokens"] > 0
