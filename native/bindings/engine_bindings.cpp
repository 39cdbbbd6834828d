// Python view of the engine room: Engine (toy or artifact-backed), its options, events and
// submit results, plus the Sampler and StopMatcher for unit tests.
//
// Every call that may wait on the engine's lock or the worker releases the GIL; the worker
// itself never touches Python.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <variant>

#include "bindings/bindings.h"
#include "engine/engine.h"
#include "engine/engine_factory.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "models/toy_model.h"

namespace py = pybind11;

namespace ninfer::bindings {

namespace {

// The Python handle: the engine plus, for toy engines, the model's test hooks.
struct PyEngine {
  std::unique_ptr<Engine> engine;
  ToyModel* toy = nullptr;
};

std::vector<std::string> bytes_list(const std::vector<py::bytes>& items) {
  std::vector<std::string> out;
  out.reserve(items.size());
  for (const auto& b : items) out.emplace_back(b);
  return out;
}

// Stop strings arrive as str (UTF-8 encoded here) or bytes.
std::vector<std::string> stop_list(const py::iterable& items) {
  std::vector<std::string> out;
  for (const auto& item : items) {
    if (py::isinstance<py::bytes>(item)) out.emplace_back(item.cast<py::bytes>());
    else out.push_back(item.cast<std::string>());
  }
  return out;
}

const char* status_name(SubmitStatus s) {
  switch (s) {
    case SubmitStatus::Accepted: return "accepted";
    case SubmitStatus::Overloaded: return "overloaded";
    case SubmitStatus::ContextExceeded: return "context_exceeded";
    case SubmitStatus::InvalidRequest: return "invalid";
    case SubmitStatus::Unavailable: return "unavailable";
  }
  return "?";
}

const char* kind_name(EventKind k) {
  switch (k) {
    case EventKind::Admitted: return "admitted";
    case EventKind::Output: return "output";
    case EventKind::QueueTimeout: return "queue_timeout";
    case EventKind::PromptProgress: return "prompt_progress";
    case EventKind::Scheduling: return "scheduling";
  }
  return "?";
}

// Stop strings come from Python str (valid UTF-8); bytes given by tests may not be.
py::str utf8_or_replace(const std::string& s) {
  PyObject* obj = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (!obj) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(obj);
}

py::object stop_reason(const EngineEvent& e) {
  switch (e.stop_kind) {
    case StopKind::String: return utf8_or_replace(e.stop_string);
    case StopKind::TokenId:
    case StopKind::Eos: return py::int_(e.stop_token);
    case StopKind::None: return py::none();
  }
  return py::none();
}

py::dict info_dict(const ModelInfo& info) {
  py::dict d;
  d["architecture"] = info.architecture;
  d["vocab_size"] = info.vocab_size;
  d["hidden_size"] = info.hidden_size;
  d["num_layers"] = info.num_layers;
  d["num_kv_layers"] = info.num_kv_layers;
  d["num_kv_heads"] = info.num_kv_heads;
  d["head_dim"] = info.head_dim;
  d["max_position_embeddings"] = info.max_position_embeddings;
  d["num_params"] = info.num_params;
  d["weight_bytes"] = info.weight_bytes;
  d["weight_format"] = info.weight_format;
  return d;
}

py::dict stats_dict(const EngineStats& s) {
  py::dict d;
  d["lanes"] = s.lanes;
  d["running"] = s.running;
  d["pending"] = s.pending;
  d["kv_pages_total"] = s.kv_pages_total;
  d["kv_pages_free"] = s.kv_pages_free;
  d["kv_pages_cached"] = s.kv_pages_cached;
  d["kv_capacity_tokens"] = s.kv_capacity_tokens;
  d["kv_page_bytes"] = s.kv_page_bytes;
  d["paused"] = s.paused;
  d["pauses"] = s.pauses;
  d["replay_restores"] = s.replay_restores;
  d["replayed_tokens"] = s.replayed_tokens;
  d["prefix_reuse"] = s.prefix_reuse;
  py::dict c;
  const PrefixCacheStats& k = s.cache;
  c["blocks"] = k.blocks;
  c["unreferenced_blocks"] = k.unreferenced_blocks;
  c["snapshots"] = k.snapshots;
  c["snapshot_slots"] = k.snapshot_slots;
  c["lookups"] = k.lookups;
  c["hits"] = k.hits;
  c["reused_tokens"] = k.reused_tokens;
  c["snapshot_hits"] = k.snapshot_hits;
  c["blocks_inserted"] = k.blocks_inserted;
  c["blocks_duplicate"] = k.blocks_duplicate;
  c["evicted_blocks"] = k.evicted_blocks;
  c["snapshots_created"] = k.snapshots_created;
  c["snapshots_evicted"] = k.snapshots_evicted;
  c["taps_created"] = k.taps_created;
  c["taps_skipped"] = k.taps_skipped;
  c["endpoints_created"] = k.endpoints_created;
  d["prefix_cache"] = c;
  py::dict h;
  const HostTierStats& t = s.host;
  h["capacity_bytes"] = t.capacity_bytes;
  h["used_bytes"] = t.used_bytes;
  h["peak_bytes"] = t.peak_bytes;
  h["blocks"] = t.blocks;
  h["snapshots"] = t.snapshots;
  h["block_writes"] = t.block_writes;
  h["image_writes"] = t.image_writes;
  h["block_restores"] = t.block_restores;
  h["image_restores"] = t.image_restores;
  h["write_bytes"] = t.write_bytes;
  h["restore_bytes"] = t.restore_bytes;
  h["block_write_bytes"] = t.block_write_bytes;
  h["block_restore_bytes"] = t.block_restore_bytes;
  h["write_seconds"] = static_cast<double>(t.write_ns) * 1e-9;
  h["restore_seconds"] = static_cast<double>(t.restore_ns) * 1e-9;
  h["block_evictions"] = t.block_evictions;
  h["snapshot_evictions"] = t.snapshot_evictions;
  h["dead_reclaims"] = t.dead_reclaims;
  h["rejected"] = t.rejected;
  h["unbacked_node_losses"] = s.unbacked_node_losses;
  h["tree_blocks"] = s.tree_blocks;
  d["host_tier"] = h;
  d["cache_problem"] = s.cache_problem;
  d["state_slots_total"] = s.state_slots_total;
  d["state_slots_used"] = s.state_slots_used;
  d["requests_admitted"] = s.requests_admitted;
  d["requests_finished"] = s.requests_finished;
  d["tokens_prefilled"] = s.tokens_prefilled;
  d["tokens_decoded"] = s.tokens_decoded;
  d["steps"] = s.steps;
  d["decode_rows"] = s.decode_rows;
  d["consecutive_failures"] = s.consecutive_failures;
  d["healthy"] = s.healthy;
  d["prefilling"] = s.prefilling;
  d["decode_ready"] = s.decode_ready;
  d["prompt_tokens"] = s.prompt_tokens;
  d["prompt_tokens_cached"] = s.prompt_tokens_cached;
  d["decode_tokens"] = s.decode_tokens;
  d["decode_rounds"] = s.decode_rounds;
  d["finished_stop"] = s.finished_stop;
  d["finished_length"] = s.finished_length;
  d["finished_cancelled"] = s.finished_cancelled;
  d["finished_error"] = s.finished_error;
  d["queue_timeouts"] = s.queue_timeouts;
  d["submits_refused"] = s.submits_refused;
  d["recoveries_out_of_memory"] = s.recoveries_out_of_memory;
  d["recoveries_failed_step"] = s.recoveries_failed_step;
  d["spec_rounds"] = s.spec_rounds;
  d["spec_draft_tokens"] = s.spec_draft_tokens;
  d["spec_accepted_tokens"] = s.spec_accepted_tokens;
  d["spec_ngram_rounds"] = s.spec_ngram_rounds;
  d["spec_ngram_draft_tokens"] = s.spec_ngram_draft_tokens;
  d["spec_ngram_accepted_tokens"] = s.spec_ngram_accepted_tokens;
  d["spec_fallback_steps"] = s.spec_fallback_steps;
  d["replaying"] = s.replaying;
  py::dict host_work;  // seconds of worker wall time by host phase
  for (size_t i = 0; i < kHostPhases; ++i)
    host_work[kHostPhaseNames[i]] = static_cast<double>(s.host_work_ns[i]) * 1e-9;
  d["host_work_seconds"] = host_work;
  d["device_wait_seconds"] = static_cast<double>(s.device_wait_ns) * 1e-9;
  d["constraint_draft_wait_seconds"] = static_cast<double>(s.constraint_draft_wait_ns) * 1e-9;
  return d;
}

SamplingParams make_sampling(float temperature, float top_p, int32_t top_k, float min_p,
                             float presence_penalty, float frequency_penalty, std::optional<uint64_t> seed) {
  SamplingParams s;
  s.temperature = temperature;
  s.top_p = top_p;
  s.top_k = top_k;
  s.min_p = min_p;
  s.presence_penalty = presence_penalty;
  s.frequency_penalty = frequency_penalty;
  s.seed = seed;
  return s;
}

EngineOptions make_options(int max_concurrency, int32_t max_context, int32_t prefill_chunk, int32_t max_pending,
                           int64_t pending_timeout_ms, std::vector<int32_t> eos_ids, bool device_sampling,
                           int64_t kv_capacity, int64_t vram_headroom_mib, bool prefix_reuse, int32_t snapshot_slots,
                           int32_t taps_per_request, int32_t tap_ladder, int32_t tap_min_gap,
                           int32_t mtp_draft_tokens, int32_t ngram_draft_tokens, int32_t ngram_min_match,
                           int64_t host_context_bytes, int32_t lm_head_draft_tokens, const std::string& kv_dtype,
                           int32_t spec_max_batch) {
  EngineOptions o;
  try {
    o.kv_dtype = kv_dtype_from_name(kv_dtype);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  o.host_context_bytes = host_context_bytes;
  o.kv_capacity = kv_capacity;
  o.vram_headroom_mib = vram_headroom_mib;
  o.prefix_reuse = prefix_reuse;
  o.snapshot_slots = snapshot_slots;
  o.taps_per_request = taps_per_request;
  o.tap_ladder = tap_ladder;
  o.tap_min_gap = tap_min_gap;
  o.spec.mtp_draft_tokens = mtp_draft_tokens;
  o.spec.ngram_draft_tokens = ngram_draft_tokens;
  o.spec.ngram_min_match = ngram_min_match;
  o.spec.lm_head_draft_tokens = lm_head_draft_tokens;
  o.spec.max_batch = spec_max_batch;
  if (auto problem = speculative_options_problem(o.spec); !problem.empty()) throw py::value_error(problem);
  o.device_sampling = device_sampling;
  o.max_concurrency = max_concurrency;
  o.max_context = max_context;
  o.prefill_chunk = prefill_chunk;
  o.max_pending = max_pending;
  o.pending_timeout_ms = pending_timeout_ms;
  o.eos_ids = std::move(eos_ids);
  return o;
}

void bind_events(py::module_& m) {
  py::class_<SubmitResult>(m, "SubmitResult")
      .def_property_readonly("status", [](const SubmitResult& r) { return status_name(r.status); })
      .def_property_readonly("accepted", [](const SubmitResult& r) { return r.status == SubmitStatus::Accepted; })
      .def_readonly("request_id", &SubmitResult::request_id)
      .def_readonly("message", &SubmitResult::message)
      .def_readonly("prompt_tokens", &SubmitResult::prompt_tokens)
      .def_readonly("max_context", &SubmitResult::max_context)
      .def_readonly("seed", &SubmitResult::seed)
      .def("__repr__", [](const SubmitResult& r) {
        return "<SubmitResult " + std::string(status_name(r.status)) + " id=" + std::to_string(r.request_id) +
               (r.message.empty() ? "" : " " + r.message) + ">";
      });

  py::class_<EngineEvent>(m, "EngineEvent")
      .def_readonly("request_id", &EngineEvent::request_id)
      .def_property_readonly("kind", [](const EngineEvent& e) { return kind_name(e.kind); })
      .def_readonly("token_ids", &EngineEvent::token_ids)
      .def_property_readonly("text", [](const EngineEvent& e) { return py::bytes(e.text); })
      .def_readonly("finished", &EngineEvent::finished)
      .def_property_readonly("finish_reason", [](const EngineEvent& e) -> py::object {
        if (e.finish_reason == FinishReason::None) return py::none();
        return py::str(finish_reason_name(e.finish_reason));
      })
      .def_property_readonly("stop_reason", &stop_reason)
      .def_property_readonly("stop_kind", [](const EngineEvent& e) -> py::object {
        switch (e.stop_kind) {
          case StopKind::Eos: return py::str("eos");
          case StopKind::TokenId: return py::str("token");
          case StopKind::String: return py::str("string");
          case StopKind::None: break;
        }
        return py::none();
      })
      .def_property_readonly("stop_token", [](const EngineEvent& e) -> py::object {
        if (e.stop_token < 0) return py::none();
        return py::int_(e.stop_token);
      })
      .def_property_readonly("constraint",
                             [](const EngineEvent& e) -> py::object {
                               if (!e.constraint) return py::none();
                               return constraint_stats_dict(*e.constraint);
                             })
      .def_readonly("prompt_tokens", &EngineEvent::prompt_tokens)
      .def_readonly("cached_tokens", &EngineEvent::cached_tokens)
      .def_readonly("prompt_processed", &EngineEvent::prompt_processed)
      .def_readonly("completion_tokens", &EngineEvent::completion_tokens)
      .def_property_readonly("logits",
                             [](const EngineEvent& e) -> py::object {
                               if (e.logits.empty()) return py::none();
                               py::array_t<float> out(static_cast<py::ssize_t>(e.logits.size()));
                               std::memcpy(out.mutable_data(), e.logits.data(), e.logits.size() * sizeof(float));
                               return out;
                             })
      .def_property_readonly("queue_ms", [](const EngineEvent& e) { return e.timings.queue_ms; })
      .def_property_readonly("prompt_ms", [](const EngineEvent& e) { return e.timings.prompt_ms; })
      .def_property_readonly("predicted_ms", [](const EngineEvent& e) { return e.timings.predicted_ms; })
      .def_property_readonly("decode_share_ms", [](const EngineEvent& e) { return e.timings.decode_share_ms; })
      .def_property_readonly("speculative",
                             [](const EngineEvent& e) -> py::object {
                               const SpeculativeTally& t = e.speculative;
                               if (!e.finished || (t.rounds == 0 && t.fallback_steps == 0)) return py::none();
                               py::dict d;
                               d["rounds"] = t.rounds;
                               d["drafted_tokens"] = t.drafted;
                               d["accepted_tokens"] = t.accepted;
                               d["fallback_steps"] = t.fallback_steps;
                               d["accepted_per_position"] = t.accepted_per_position;
                               d["ngram_rounds"] = t.ngram_rounds;
                               d["ngram_drafted_tokens"] = t.ngram_drafted;
                               d["ngram_accepted_tokens"] = t.ngram_accepted;
                               return d;
                             })
      .def_property_readonly("draft_n", [](const EngineEvent& e) { return e.timings.draft_n; })
      .def_property_readonly("draft_n_accepted", [](const EngineEvent& e) { return e.timings.draft_n_accepted; })
      .def_property_readonly("transition",
                             [](const EngineEvent& e) -> py::object {
                               if (!e.transition) return py::none();
                               const SchedulingTransition& t = *e.transition;
                               auto progress = [](const WorkProgress& p) {
                                 return py::dict(py::arg("prefill_tokens") = p.prefill,
                                                 py::arg("decode_tokens") = p.decode,
                                                 py::arg("replayed_tokens") = p.replay);
                               };
                               return py::dict(
                                   py::arg("transition") = t.name, py::arg("preemption_index") = t.preemption_index,
                                   py::arg("route") = t.route.empty() ? py::object(py::none()) : py::str(t.route),
                                   py::arg("steady_ns") = t.steady_ns, py::arg("elapsed_ns") = t.elapsed_ns,
                                   py::arg("progress") = py::dict(py::arg("global") = progress(t.global),
                                                                  py::arg("request") = progress(t.request)));
                             })
      .def_property_readonly("scheduling",
                             [](const EngineEvent& e) {
                               return py::dict(py::arg("preemptions") = e.scheduling.preemptions,
                                               py::arg("replayed_tokens") = e.scheduling.replayed_tokens,
                                               py::arg("paused_seconds") = e.scheduling.paused_ms / 1000.0);
                             })
      .def_property_readonly("error", [](const EngineEvent& e) -> py::object {
        if (e.error.empty()) return py::none();
        return py::str(e.error);
      })
      .def("__repr__", [](const EngineEvent& e) {
        return "<EngineEvent id=" + std::to_string(e.request_id) + " " + kind_name(e.kind) +
               " tokens=" + std::to_string(e.token_ids.size()) + (e.finished ? " finished " : "") +
               finish_reason_name(e.finish_reason) + ">";
      });
}

void bind_engine_class(py::module_& m) {
  py::class_<EngineOptions>(m, "EngineOptions")
      .def(py::init(&make_options), py::kw_only(), py::arg("max_concurrency") = 1, py::arg("max_context") = 0,
           py::arg("prefill_chunk") = 512, py::arg("max_pending") = 16, py::arg("pending_timeout_ms") = 0,
           py::arg("eos_ids") = std::vector<int32_t>{}, py::arg("device_sampling") = true,
           py::arg("kv_capacity") = 0, py::arg("vram_headroom_mib") = 1024, py::arg("prefix_reuse") = true,
           py::arg("snapshot_slots") = 0, py::arg("taps_per_request") = -1, py::arg("tap_ladder") = 0,
           py::arg("tap_min_gap") = 0, py::arg("mtp_draft_tokens") = 0, py::arg("ngram_draft_tokens") = 0,
           py::arg("ngram_min_match") = 12, py::arg("host_context_bytes") = 0, py::arg("lm_head_draft_tokens") = 0,
           py::arg("kv_dtype") = "bf16", py::arg("spec_max_batch") = -1)
      .def_readwrite("kv_capacity", &EngineOptions::kv_capacity)
      .def_property_readonly("kv_dtype",
                             [](const EngineOptions& o) { return std::string(kv_dtype_name(o.kv_dtype)); })
      .def_readwrite("host_context_bytes", &EngineOptions::host_context_bytes)
      .def_readwrite("vram_headroom_mib", &EngineOptions::vram_headroom_mib)
      .def_readwrite("prefix_reuse", &EngineOptions::prefix_reuse)
      .def_readwrite("snapshot_slots", &EngineOptions::snapshot_slots)
      .def_readwrite("taps_per_request", &EngineOptions::taps_per_request)
      .def_readwrite("tap_ladder", &EngineOptions::tap_ladder)
      .def_readwrite("tap_min_gap", &EngineOptions::tap_min_gap)
      .def_readwrite("max_concurrency", &EngineOptions::max_concurrency)
      .def_readwrite("max_context", &EngineOptions::max_context)
      .def_readwrite("prefill_chunk", &EngineOptions::prefill_chunk)
      .def_readwrite("max_pending", &EngineOptions::max_pending)
      .def_readwrite("pending_timeout_ms", &EngineOptions::pending_timeout_ms)
      .def_readwrite("eos_ids", &EngineOptions::eos_ids)
      .def_readwrite("device_sampling", &EngineOptions::device_sampling)
      .def_property_readonly("mtp_draft_tokens", [](const EngineOptions& o) { return o.spec.mtp_draft_tokens; })
      .def_property_readonly("ngram_draft_tokens", [](const EngineOptions& o) { return o.spec.ngram_draft_tokens; })
      .def_property_readonly("ngram_min_match", [](const EngineOptions& o) { return o.spec.ngram_min_match; })
      .def_property_readonly("lm_head_draft_tokens",
                             [](const EngineOptions& o) { return o.spec.lm_head_draft_tokens; })
      .def_property_readonly("spec_max_batch", [](const EngineOptions& o) { return o.spec.max_batch; });

  py::class_<PyEngine>(m, "Engine")
      .def_static(
          "toy",
          [](int64_t vocab_size, const std::vector<py::bytes>& token_bytes, const EngineOptions& options) {
            auto bytes = bytes_list(token_bytes);
            py::gil_scoped_release release;
            PyEngine e;
            e.engine = make_toy_engine(vocab_size, std::move(bytes), options, &e.toy);
            return e;
          },
          py::arg("vocab_size"), py::arg("token_bytes"), py::arg("options"),
          "An engine over the weightless deterministic ToyModel (tests).")
      .def_static(
          "open",
          [](const std::string& artifact_path, const EngineOptions& options, const std::vector<py::bytes>& token_bytes,
             std::optional<std::vector<int32_t>> eos_ids, int threads, const std::string& device,
             int64_t random_weights_seed, int tensor_parallel_size, const std::string& random_weights_dtype) {
            auto bytes = bytes_list(token_bytes);
            EngineOptions resolved = options;
            if (eos_ids) resolved.eos_ids = *eos_ids;
            RuntimeOptions runtime;
            runtime.threads = threads;
            runtime.device = device;
            runtime.random_weights_seed = random_weights_seed;
            runtime.tensor_parallel_size = tensor_parallel_size;
            runtime.random_weights_dtype = random_weights_dtype;
            py::gil_scoped_release release;
            PyEngine e;
            e.engine = open_engine(artifact_path, std::move(resolved), std::move(bytes), runtime);
            return e;
          },
          py::arg("artifact_path"), py::arg("options"), py::arg("token_bytes"), py::arg("eos_ids") = py::none(),
          py::arg("threads") = 0, py::arg("device") = "cpu", py::arg("random_weights_seed") = -1,
          py::arg("tensor_parallel_size") = 1, py::arg("random_weights_dtype") = "bf16",
          "An engine over a .ninfer artifact's model. eos_ids None = options.eos_ids, or the artifact's own.")
      .def(
          "submit",
          [](PyEngine& self, std::vector<int32_t> prompt_ids, int32_t max_tokens, float temperature, float top_p,
             int32_t top_k, float min_p, float presence_penalty, float frequency_penalty,
             std::optional<uint64_t> seed, std::vector<int32_t> stop_token_ids, const py::iterable& stop_strings,
             bool ignore_eos, int32_t min_tokens, int32_t thinking_budget, bool thinking_open,
             int32_t think_open_id, int32_t think_close_id, std::vector<int32_t> thinking_close_ids,
             std::optional<CompileOutcome> constraint, int32_t constraint_start_after,
             const std::string& constraint_prefix,
             bool capture_logits, std::vector<int32_t> cache_candidates,
             bool report_progress,
             std::vector<int32_t> draft_oracle) {
            GenerationParams p;
            p.prompt = std::move(prompt_ids);
            p.max_tokens = max_tokens;
            p.sampling = make_sampling(temperature, top_p, top_k, min_p, presence_penalty, frequency_penalty, seed);
            p.stop_token_ids = std::move(stop_token_ids);
            p.stop_strings = stop_list(stop_strings);
            p.ignore_eos = ignore_eos;
            p.min_tokens = min_tokens;
            p.capture_logits = capture_logits;
            p.cache_candidates = std::move(cache_candidates);
            p.thinking.limit = thinking_budget;
            p.thinking.starts_open = thinking_open;
            p.thinking.open_id = think_open_id;
            p.thinking.close_id = think_close_id;
            p.thinking.close_ids = std::move(thinking_close_ids);
            p.draft_oracle = std::move(draft_oracle);
            if (constraint) {
              p.constraint = ConstraintRequest{constraint->constraint, constraint_start_after, constraint->cache,
                                               constraint->seconds, constraint_prefix};
            }
            p.report_progress = report_progress;
            py::gil_scoped_release release;
            return self.engine->submit(std::move(p));
          },
          py::arg("prompt_ids"), py::arg("max_tokens"), py::kw_only(), py::arg("temperature") = 1.0f,
          py::arg("top_p") = 1.0f, py::arg("top_k") = 0, py::arg("min_p") = 0.0f, py::arg("presence_penalty") = 0.0f,
          py::arg("frequency_penalty") = 0.0f, py::arg("seed") = py::none(),
          py::arg("stop_token_ids") = std::vector<int32_t>{}, py::arg("stop_strings") = py::list(),
          py::arg("ignore_eos") = false, py::arg("min_tokens") = 0, py::arg("thinking_budget") = -1,
          py::arg("thinking_open") = false, py::arg("think_open_id") = -1, py::arg("think_close_id") = -1,
          py::arg("thinking_close_ids") = std::vector<int32_t>{}, py::arg("constraint") = py::none(),
          py::arg("constraint_start_after") = -1, py::arg("constraint_prefix") = "",
          py::arg("capture_logits") = false, py::arg("cache_candidates") = std::vector<int32_t>{},
          py::arg("report_progress") = false, py::arg("draft_oracle") = std::vector<int32_t>{},
          "thinking_budget >= 0 caps the tokens committed while thinking is open: then "
          "thinking_close_ids are committed without sampling (see engine/thinking_budget.h). "
          "constraint: a compiled grammar; tokens outside it are never sampled. "
          "report_progress: a prompt_progress event after each prefill chunk that leaves more prompt.")
      .def(
          "compile_grammar",
          [](PyEngine& self, const std::string& kind, const std::string& source, const std::string& lead) {
            GrammarCompiler* compiler = nullptr;
            {
              py::gil_scoped_release release;
              compiler = &self.engine->grammars();
            }
            return compile_grammar(*compiler, kind, source, lead);
          },
          py::arg("kind"), py::arg("source"), py::arg("lead") = "",
          "Compiles (or finds in the cache) an output constraint over this engine's vocabulary.")
      .def(
          "prepare_grammars",
          [](PyEngine& self) {
            py::gil_scoped_release release;
            const auto start = std::chrono::steady_clock::now();
            self.engine->grammars();
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          },
          "Builds the grammar vocabulary (the tokenizer table every compile needs) now rather than "
          "on the first constrained request; returns the seconds it took (about 0 once built). "
          "Call after set_grammar_special_ids.")
      .def(
          "set_grammar_special_ids",
          [](PyEngine& self, std::vector<int32_t> ids) { self.engine->set_grammar_special_ids(std::move(ids)); },
          py::arg("ids"), "Control tokens no output constraint may produce; before the first compile.")
      .def(
          "cancel", [](PyEngine& self, uint64_t id) { self.engine->cancel(id); }, py::arg("request_id"),
          py::call_guard<py::gil_scoped_release>())
      .def("drain_events",
           [](PyEngine& self) {
             std::vector<EngineEvent> events;
             {
               py::gil_scoped_release release;
               events = self.engine->drain_events();
             }
             return events;
           })
      .def_property_readonly("event_fd", [](const PyEngine& self) { return self.engine->event_fd(); })
      .def(
          "stats",
          [](const PyEngine& self, bool check_cache) {
            EngineStats s;
            {
              py::gil_scoped_release release;
              s = self.engine->stats(check_cache);
            }
            py::dict d = stats_dict(s);
            if (!check_cache) d["cache_problem"] = py::none();
            return d;
          },
          py::kw_only(), py::arg("check_cache") = false,
          "check_cache: also verify the prefix cache's invariants (cache_problem: \"\" when they hold).")
      .def_property_readonly("healthy", [](const PyEngine& self) { return self.engine->healthy(); })
      .def_property_readonly("samples_on_device",
                             [](const PyEngine& self) { return self.engine->samples_on_device(); })
      .def_property_readonly("max_context", [](const PyEngine& self) { return self.engine->options().max_context; })
      .def_property_readonly("kv_capacity",
                             [](const PyEngine& self) { return self.engine->stats().kv_capacity_tokens; })
      .def_property_readonly("kv_dtype",
                             [](const PyEngine& self) { return std::string(kv_dtype_name(self.engine->options().kv_dtype)); })
      .def_property_readonly("options", [](const PyEngine& self) { return self.engine->options(); })
      .def_property_readonly("max_concurrency",
                             [](const PyEngine& self) { return self.engine->options().max_concurrency; })
      .def_property_readonly("eos_ids", [](const PyEngine& self) { return self.engine->options().eos_ids; })
      .def_property_readonly("model_info", [](const PyEngine& self) { return info_dict(self.engine->model_info()); })
      .def("shutdown", [](PyEngine& self) { self.engine->shutdown(); }, py::call_guard<py::gil_scoped_release>())
      .def(
          "save_prefix_cache",
          [](PyEngine& self, const std::string& path) {
            CacheFileReport r;
            {
              py::gil_scoped_release release;
              r = self.engine->save_prefix_cache(path);
            }
            return py::dict(py::arg("ok") = r.ok, py::arg("message") = r.message, py::arg("blocks") = r.blocks,
                            py::arg("snapshots") = r.snapshots, py::arg("bytes") = r.bytes);
          },
          py::arg("path"), "After shutdown: writes the prefix cache to PATH.tmp, then renames it to PATH.")
      .def(
          "load_prefix_cache",
          [](PyEngine& self, const std::string& path) {
            CacheFileReport r;
            {
              py::gil_scoped_release release;
              r = self.engine->load_prefix_cache(path);
            }
            return py::dict(py::arg("ok") = r.ok, py::arg("message") = r.message, py::arg("blocks") = r.blocks,
                            py::arg("snapshots") = r.snapshots, py::arg("bytes") = r.bytes);
          },
          py::arg("path"), "Before the first submit: restores what PATH holds (a foreign or damaged file: nothing).")
      .def(
          "inject_step_failures",
          [](PyEngine& self, int count, bool out_of_memory) { self.engine->inject_step_failures(count, out_of_memory); },
          py::arg("count"), py::kw_only(), py::arg("out_of_memory") = false,
          "Test hook: the next `count` model steps fail (as out of memory, or as a failed check) "
          "through the engine's recovery path.")
      .def(
          "inject_device_fault", [](PyEngine& self, int after_steps) { self.engine->inject_device_fault(after_steps); },
          py::arg("after_steps"),
          "Test hook: after `after_steps` more model steps, the next one fails with a fatal device error "
          "(as a CUDA illegal address would): the engine stops and reports device_failure.")
      .def_property_readonly("device_failure",
                             [](const PyEngine& self) -> py::object {
                               std::string what = self.engine->device_failure();
                               if (what.empty()) return py::none();
                               return py::str(what);
                             })
      .def(
          "toy_fail_next_forwards",
          [](PyEngine& self, int count) {
            if (!self.toy) throw py::value_error("only toy engines have injectable failures");
            self.toy->fail_next_forwards(count);
          },
          py::arg("count"))
      .def(
          "toy_set_step_delay_us",
          [](PyEngine& self, int64_t us) {
            if (!self.toy) throw py::value_error("only toy engines have this hook");
            self.toy->set_step_delay_us(us);
          },
          py::arg("us"), "Every toy forward sleeps this long (paces the engine like a real model).")
      .def(
          "toy_sample_on_device",
          [](PyEngine& self, bool on) {
            if (!self.toy) throw py::value_error("only toy engines have this hook");
            self.toy->set_samples_on_device(on);
          },
          py::arg("on"), "The toy model samples through the device-sampling path (host reference).")
      .def(
          "toy_poison_next_rows",
          [](PyEngine& self, int count, float value) {
            if (!self.toy) throw py::value_error("only toy engines have this hook");
            self.toy->poison_next_rows(count, value);
          },
          py::arg("count"), py::arg("value"), "Every logit of the next `count` logit rows becomes `value`.")
      .def(
          "toy_set_step_delay_us",
          [](PyEngine& self, int64_t us) {
            if (!self.toy) throw py::value_error("only toy engines have a step delay");
            self.toy->set_step_delay_us(us);
          },
          py::arg("microseconds"));
}

void bind_sampling_tools(py::module_& m) {
  py::class_<Sampler>(m, "Sampler")
      .def(py::init([](float temperature, float top_p, int32_t top_k, float min_p, float presence_penalty,
                       float frequency_penalty, uint64_t seed) {
             return Sampler(make_sampling(temperature, top_p, top_k, min_p, presence_penalty, frequency_penalty, seed),
                            seed);
           }),
           py::kw_only(), py::arg("temperature") = 1.0f, py::arg("top_p") = 1.0f, py::arg("top_k") = 0,
           py::arg("min_p") = 0.0f, py::arg("presence_penalty") = 0.0f, py::arg("frequency_penalty") = 0.0f,
           py::arg("seed") = 0)
      .def(
          "sample",
          [](Sampler& self, py::array_t<float, py::array::c_style | py::array::forcecast> logits,
             const std::unordered_map<int32_t, int32_t>& generated, const std::vector<int32_t>& suppressed) {
            std::vector<float> scratch(logits.data(), logits.data() + logits.size());
            TokenCounts counts(generated.begin(), generated.end());
            py::gil_scoped_release release;
            return self.sample(scratch, counts, suppressed);
          },
          py::arg("logits"), py::arg("generated") = std::unordered_map<int32_t, int32_t>{},
          py::arg("suppressed") = std::vector<int32_t>{})
      .def(
          "sample_with_draw",
          [](Sampler& self, py::array_t<float, py::array::c_style | py::array::forcecast> logits,
             const std::unordered_map<int32_t, int32_t>& generated, const std::vector<int32_t>& suppressed, double u) {
            std::vector<float> scratch(logits.data(), logits.data() + logits.size());
            TokenCounts counts(generated.begin(), generated.end());
            py::gil_scoped_release release;
            return self.sample_with_draw(scratch, counts, suppressed, u);
          },
          py::arg("logits"), py::arg("generated"), py::arg("suppressed"), py::arg("u"))
      .def("next_draw", &Sampler::next_draw, "The generator's next draw in [0, 1) (what sample would use).")
      .def(
          "sample_many",
          [](Sampler& self, py::array_t<float, py::array::c_style | py::array::forcecast> logits, int64_t draws,
             const std::unordered_map<int32_t, int32_t>& generated) {
            if (draws < 0) throw py::value_error("draws must not be negative");
            std::vector<float> source(logits.data(), logits.data() + logits.size());
            TokenCounts counts(generated.begin(), generated.end());
            py::array_t<int32_t> out(draws);
            auto* dst = out.mutable_data();
            py::gil_scoped_release release;
            std::vector<float> scratch;
            for (int64_t i = 0; i < draws; ++i) {
              scratch = source;
              dst[i] = self.sample(scratch, counts, {});
            }
            return out;
          },
          py::arg("logits"), py::arg("draws"), py::arg("generated") = std::unordered_map<int32_t, int32_t>{});

  py::class_<StopMatcher>(m, "StopMatcher")
      .def(py::init([](const py::iterable& stops) { return StopMatcher(stop_list(stops)); }), py::arg("stops"))
      .def(
          "push",
          [](StopMatcher& self, const py::bytes& data, bool may_match) {
            auto r = self.push(std::string(data), may_match);
            py::object matched = r.matched ? py::object(py::int_(*r.matched)) : py::object(py::none());
            return py::make_tuple(py::bytes(r.released), matched);
          },
          py::arg("data"), py::arg("may_match") = true)
      .def("flush", [](StopMatcher& self) { return py::bytes(self.flush()); })
      .def_property_readonly("held_bytes", &StopMatcher::held_bytes);
}

}  // namespace

void bind_engine(py::module_& m) {
  bind_grammar(m);
  bind_events(m);
  bind_engine_class(m);
  bind_sampling_tools(m);
  bind_sampling(m);
}

}  // namespace ninfer::bindings
