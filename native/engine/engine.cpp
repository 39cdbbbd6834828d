#include "engine/engine.h"

#include "models/qwen3_5.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <span>
#include <stdexcept>
#include <string_view>

#include "backends/device_error.h"
#include "engine/constraint_matcher.h"

namespace ninfer {

namespace {

double elapsed_ms(EngineClock::time_point from, EngineClock::time_point to) {
  if (to <= from) return 0.0;
  return std::chrono::duration<double, std::milli>(to - from).count();
}

bool contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// An allocation that failed (host or device) rather than a broken invariant: the unit's
// requests fail, but nothing says the next unit cannot succeed once they are gone.
bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return true;
  const std::string_view what = e.what();
  return what.find("cudaErrorMemoryAllocation") != std::string_view::npos ||
         what.find("out of memory") != std::string_view::npos;
}

class InjectedOutOfMemory : public std::bad_alloc {
 public:
  const char* what() const noexcept override { return "injected out-of-memory condition"; }
};

// One sampling thread per lane, up to the machine's hardware threads.
int sampling_threads(int lanes) {
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::clamp(lanes, 1, hardware);
}

}  // namespace

int64_t kv_pages_for(const EngineOptions& options) {
  const int64_t pages_per_lane = (static_cast<int64_t>(options.max_context) + kPageTokens - 1) / kPageTokens;
  return static_cast<int64_t>(options.max_concurrency) * pages_per_lane;
}

EngineOptions resolve_cache_defaults(EngineOptions o) {
  // Without a host tier every snapshot lives in a device slot only: fewer taps, more slots.
  const bool host_tier = o.host_context_bytes > 0 && o.prefix_reuse;
  if (o.snapshot_slots <= 0) o.snapshot_slots = o.max_concurrency + (host_tier ? 1 : 3);
  if (o.taps_per_request < 0) o.taps_per_request = host_tier ? 8 : 2;
  if (o.tap_ladder <= 0) o.tap_ladder = std::max(4096, 2 * o.prefill_chunk);
  if (o.tap_min_gap <= 0) o.tap_min_gap = std::max(1024, o.prefill_chunk);
  return o;
}

namespace {

uint64_t model_identity(const ModelInfo& info) {
  // The device cache lives as long as the process and its one model, so the identity only has
  // to separate what could differ inside one build: the architecture and its shapes.
  uint64_t h = std::hash<std::string>{}(info.architecture + "|" + info.weight_format);
  for (int64_t v : {info.vocab_size, info.hidden_size, info.num_layers, info.num_kv_layers, info.num_kv_heads,
                    info.head_dim, info.num_params, info.weight_bytes})
    h = h * 0x100000001b3ULL ^ static_cast<uint64_t>(v);
  return h;
}

std::unique_ptr<PrefixCache> make_cache(const EngineOptions& options, KvPool* pool, Model* model) {
  if (!options.prefix_reuse || !pool || !model) return nullptr;
  return std::make_unique<PrefixCache>(*pool, model_identity(model->info()), model->snapshot_slots(),
                                       model->has_recurrent_state());
}

}  // namespace

Engine::Engine(std::unique_ptr<KvPool> pool, std::unique_ptr<Model> model, EngineOptions options,
               std::vector<std::string> token_bytes, std::shared_ptr<const void> keepalive)
    : keepalive_(std::move(keepalive)),
      pool_(std::move(pool)),
      model_(std::move(model)),
      options_(std::move(options)),
      token_bytes_(std::move(token_bytes)),
      vocab_size_(model_ ? model_->info().vocab_size : 0),
      cache_(make_cache(options_, pool_.get(), model_.get())),
      scheduler_((options_.max_concurrency >= 1 && options_.max_concurrency <= 8) ? options_.max_concurrency : 1,
                 std::max(options_.prefill_chunk, 1), *pool_, cache_.get()),
      sampling_pool_(sampling_threads(options_.max_concurrency)) {
  if (!pool_ || !model_) throw std::invalid_argument("engine needs a model and a KV pool");
  if (options_.max_concurrency < 1 || options_.max_concurrency > 8)
    throw std::invalid_argument("max_concurrency must be between 1 and 8, got " +
                                std::to_string(options_.max_concurrency));
  if (options_.max_context < 1)
    throw std::invalid_argument("max_context must be positive, got " + std::to_string(options_.max_context));
  if (options_.prefill_chunk < 1)
    throw std::invalid_argument("prefill_chunk must be positive, got " + std::to_string(options_.prefill_chunk));
  if (options_.max_pending < 0)
    throw std::invalid_argument("max_pending must not be negative, got " + std::to_string(options_.max_pending));
  if (options_.pending_timeout_ms < 0)
    throw std::invalid_argument("pending_timeout_ms must not be negative");
  if (vocab_size_ < 1) throw std::invalid_argument("model reports an empty vocabulary");
  if (auto problem = speculative_options_problem(options_.spec); !problem.empty())
    throw std::invalid_argument(problem);
  if (options_.spec.mtp_draft_tokens > 0) {
    mtp_ = dynamic_cast<MtpHead*>(model_.get());
    if (!mtp_ || mtp_->mtp_layers() == 0)
      throw std::invalid_argument("--spec mtp needs a model with an MTP head; the " + model_->info().architecture +
                                  " artifact has none");
    const int64_t tokens = options_.prefill_chunk + static_cast<int64_t>(options_.max_concurrency) *
                                                        (1 + options_.spec.max_drafts());
    hidden_.resize(static_cast<size_t>(tokens * model_->info().hidden_size));
  }
  logits_.resize(static_cast<size_t>(options_.max_concurrency * (1 + options_.spec.max_drafts()) * vocab_size_));
  install_host_tier();
  worker_ = std::thread([this] { run(); });
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::string Engine::validate(const GenerationParams& p) const {
  const auto& s = p.sampling;
  if (p.prompt.empty()) return "prompt must contain at least one token";
  for (size_t i = 0; i < p.prompt.size(); ++i) {
    if (p.prompt[i] < 0 || p.prompt[i] >= vocab_size_)
      return "prompt token " + std::to_string(p.prompt[i]) + " at position " + std::to_string(i) +
             " is outside the vocabulary (size " + std::to_string(vocab_size_) + ")";
  }
  if (p.max_tokens < 0) return "max_tokens must not be negative, got " + std::to_string(p.max_tokens);
  if (p.min_tokens < 0) return "min_tokens must not be negative, got " + std::to_string(p.min_tokens);
  if (!std::isfinite(s.temperature) || s.temperature < 0)
    return "temperature must be a finite number >= 0, got " + std::to_string(s.temperature);
  if (!(s.top_p > 0 && s.top_p <= 1)) return "top_p must be in (0, 1], got " + std::to_string(s.top_p);
  if (s.top_k < 0) return "top_k must not be negative, got " + std::to_string(s.top_k);
  if (!(s.min_p >= 0 && s.min_p <= 1)) return "min_p must be in [0, 1], got " + std::to_string(s.min_p);
  if (!std::isfinite(s.presence_penalty)) return "presence_penalty must be finite";
  if (!std::isfinite(s.frequency_penalty)) return "frequency_penalty must be finite";
  for (int32_t id : p.stop_token_ids)
    if (id < 0 || id >= vocab_size_)
      return "stop token id " + std::to_string(id) + " is outside the vocabulary (size " +
             std::to_string(vocab_size_) + ")";
  for (int32_t id : p.draft_oracle)
    if (id < 0 || id >= vocab_size_) return "draft oracle id " + std::to_string(id) + " is outside the vocabulary";
  for (const auto& stop : p.stop_strings)
    if (stop.empty()) return "stop strings must not be empty";
  const auto& t = p.thinking;
  if (t.active()) {
    if (t.close_ids.empty()) return "a thinking budget needs the ids of its close sequence";
    for (int32_t id : t.close_ids)
      if (id < 0 || id >= vocab_size_)
        return "thinking close id " + std::to_string(id) + " is outside the vocabulary (size " +
               std::to_string(vocab_size_) + ")";
  }
  if (t.open_id >= vocab_size_ || t.close_id >= vocab_size_) return "thinking marker ids are outside the vocabulary";
  if (p.constraint) {
    if (!p.constraint->grammar) return "the constraint has no compiled grammar";
    if (p.ignore_eos) return "a constrained request ends at the model's EOS, so ignore_eos cannot be set";
    if (p.constraint->start_after >= vocab_size_)
      return "the constraint's start token " + std::to_string(p.constraint->start_after) + " is outside the vocabulary";
  }
  return {};
}

SubmitResult Engine::submit(GenerationParams params) {
  SubmitResult result;
  result.prompt_tokens = static_cast<int32_t>(params.prompt.size());
  result.max_context = options_.max_context;
  if (auto problem = validate(params); !problem.empty()) {
    result.status = SubmitStatus::InvalidRequest;
    result.message = std::move(problem);
    return result;
  }
  // The prompt must leave room for the first output token (none is needed for max_tokens 0).
  const int64_t reserved = params.max_tokens > 0 ? 1 : 0;
  const int32_t ceiling = context_ceiling();
  result.max_context = ceiling;
  if (static_cast<int64_t>(params.prompt.size()) + reserved > ceiling) {
    result.status = SubmitStatus::ContextExceeded;
    result.message = "prompt has " + std::to_string(params.prompt.size()) + " tokens but the context ceiling is " +
                     std::to_string(ceiling) + " tokens" +
                     (ceiling < options_.max_context ? " (the KV capacity)" : "");
    return result;
  }
  const int32_t output_cap = std::min<int32_t>(params.max_tokens, ceiling - result.prompt_tokens);
  const uint64_t seed = params.sampling.seed.value_or(Sampler::random_seed());
  const auto now = EngineClock::now();

  std::lock_guard lock(mu_);
  if (stopping_ || !healthy_) {
    submits_refused_.fetch_add(1, std::memory_order_relaxed);
    result.status = SubmitStatus::Unavailable;
    result.message = failure_.empty() ? "the engine is shutting down" : failure_;
    return result;
  }
  const size_t capacity = static_cast<size_t>(options_.max_concurrency) + static_cast<size_t>(options_.max_pending);
  if (live_.size() >= capacity) {
    submits_refused_.fetch_add(1, std::memory_order_relaxed);
    result.status = SubmitStatus::Overloaded;
    result.message = "all " + std::to_string(options_.max_concurrency) + " lanes and " +
                     std::to_string(options_.max_pending) + " pending slots are in use";
    return result;
  }
  std::shared_ptr<Sequence> seq;
  try {
    seq = std::make_shared<Sequence>(next_id_, std::move(params), output_cap, seed, vocab_size_);
  } catch (const std::invalid_argument& e) {  // a constraint prefix the grammar rejects
    result.status = SubmitStatus::InvalidRequest;
    result.message = e.what();
    return result;
  }
  ++next_id_;
  seq->submitted = now;
  if (options_.pending_timeout_ms > 0) seq->deadline = now + std::chrono::milliseconds(options_.pending_timeout_ms);
  result.request_id = seq->id;
  result.seed = seed;
  live_.emplace(seq->id, seq);
  scheduler_.enqueue(std::move(seq));
  wake_.notify_one();
  return result;
}

void Engine::cancel(uint64_t request_id) {
  std::unique_lock lock(mu_);
  auto it = live_.find(request_id);
  if (it == live_.end()) return;
  it->second->cancel_requested = true;
  if (auto seq = scheduler_.remove_pending(request_id)) {
    EngineEvent event = base_event(*seq, EventKind::Output);
    finish(*seq, event, FinishReason::Cancelled);
    live_.erase(it);
    requests_finished_.fetch_add(1, std::memory_order_relaxed);
    lock.unlock();
    events_.push(std::move(event));
  }
  // A resident request is finished by the worker at the next boundary.
}

EngineStats Engine::stats(bool check_cache) const {
  EngineStats s;
  {
    std::lock_guard lock(mu_);
    s.lanes = scheduler_.num_lanes();
    s.running = scheduler_.running();
    s.pending = scheduler_.pending();
    s.kv_pages_total = pool_->num_pages();
    s.kv_pages_free = scheduler_.available_pages();
    s.kv_capacity_tokens = pool_->capacity_tokens();
    s.kv_page_bytes = pool_->has_storage() ? pool_->page_bytes(row_bytes(pool_->storage().dtype, 1)) : 0;
    s.paused = scheduler_.paused();
    s.pauses = scheduler_.pauses();
    s.prefix_reuse = cache_ != nullptr;
    if (cache_) {
      s.cache = cache_->stats();
      if (host_) s.host = host_->stats();
      s.tree_blocks = s.cache.blocks + (host_ ? host_->blocks_not([this](uint64_t k) { return cache_->contains(k); }) : 0);
      // Without a host tier every device eviction loses its block.
      s.unbacked_node_losses = host_ ? unbacked_node_losses_ : s.cache.evicted_blocks;
      s.kv_pages_cached = s.cache.blocks;
      if (check_cache) s.cache_problem = cache_->check();
      if (check_cache && host_ && s.cache_problem.empty()) s.cache_problem = host_->check();
    }
  }
  const ModelInfo& info = model_->info();
  if (info.num_kv_layers < info.num_layers) {
    s.state_slots_total = s.lanes;
    s.state_slots_used = s.running;
  }
  s.requests_admitted = requests_admitted_.load();
  s.replay_restores = replay_restores_.load();
  s.replayed_tokens = tokens_replayed_.load();
  s.requests_finished = requests_finished_.load();
  s.tokens_prefilled = tokens_prefilled_.load();
  s.tokens_decoded = tokens_decoded_.load();
  s.steps = steps_.load();
  s.decode_rows = decode_rows_.load();
  s.consecutive_failures = failures_gauge_.load();
  s.healthy = healthy_.load();
  s.prefilling = prefilling_gauge_.load();
  s.decode_ready = decode_ready_gauge_.load();
  s.prompt_tokens = prompt_tokens_.load();
  s.prompt_tokens_cached = prompt_tokens_cached_.load();
  s.decode_tokens = decode_tokens_.load();
  s.decode_rounds = decode_rounds_.load();
  s.finished_stop = finished_stop_.load();
  s.finished_length = finished_length_.load();
  s.finished_cancelled = finished_cancelled_.load();
  s.finished_error = finished_error_.load();
  s.queue_timeouts = queue_timeouts_.load();
  s.submits_refused = submits_refused_.load();
  s.recoveries_out_of_memory = recoveries_out_of_memory_.load();
  s.recoveries_failed_step = recoveries_failed_step_.load();
  s.spec_rounds = spec_rounds_.load();
  s.spec_draft_tokens = spec_draft_tokens_.load();
  s.spec_accepted_tokens = spec_accepted_tokens_.load();
  s.spec_ngram_rounds = spec_ngram_rounds_.load();
  s.spec_ngram_draft_tokens = spec_ngram_draft_tokens_.load();
  s.spec_ngram_accepted_tokens = spec_ngram_accepted_tokens_.load();
  s.spec_fallback_steps = spec_fallback_steps_.load();
  s.replaying = replaying_gauge_.load();
  for (size_t i = 0; i < kHostPhases; ++i) s.host_work_ns[i] = worker_time_.host_ns(static_cast<HostPhase>(i));
  s.device_wait_ns = worker_time_.device_wait_ns();
  s.constraint_draft_wait_ns = constraint_draft_wait_ns_.load();
  return s;
}

void Engine::inject_step_failures(int count, bool out_of_memory) {
  injected_out_of_memory_ = out_of_memory;
  injected_failures_ = std::max(count, 0);
}

void Engine::inject_device_fault(int after_steps) { device_fault_after_ = std::max(after_steps, -1); }

std::string Engine::device_failure() const {
  std::lock_guard lock(mu_);
  return device_failure_;
}

void Engine::fail_device(const std::string& what) {
  {
    std::lock_guard lock(mu_);
    device_failure_ = what;
  }
  fail_everything("device failure: " + what);
}

void Engine::throw_if_injected() {
  int fault = device_fault_after_.load();
  while (fault >= 0 && !device_fault_after_.compare_exchange_weak(fault, fault - 1)) {
  }
  if (fault == 0)
    throw DeviceFatalError(
        "CUDA_CHECK(cudaStreamSynchronize(stream)) failed: cudaErrorIllegalAddress (an illegal memory "
        "access was encountered) [injected by the engine's device-fault test hook]");
  int left = injected_failures_.load();
  while (left > 0 && !injected_failures_.compare_exchange_weak(left, left - 1)) {
  }
  if (left <= 0) return;
  if (injected_out_of_memory_) throw InjectedOutOfMemory();
  throw std::runtime_error("injected failed internal check");
}

bool Engine::is_eos(int32_t token) const { return contains(options_.eos_ids, token); }

void Engine::set_grammar_special_ids(std::vector<int32_t> ids) {
  std::lock_guard lock(grammar_mu_);
  if (grammars_) throw std::logic_error("the grammar vocabulary is fixed once a grammar has been compiled");
  grammar_special_ids_ = std::move(ids);
}

GrammarCompiler& Engine::grammars() {
  std::lock_guard lock(grammar_mu_);
  if (!grammars_)
    grammars_ = std::make_unique<GrammarCompiler>(token_bytes_, vocab_size_, options_.eos_ids, grammar_special_ids_);
  return *grammars_;
}

bool Engine::mask_constrained_row(Sequence& seq, std::span<float> logits) const {
  thread_local std::vector<uint32_t> bitmask;
  bitmask.resize(static_cast<size_t>(seq.constraint->bitmask_words()));
  if (seq.constraint->fill_next_mask(bitmask) == 0) return false;
  apply_token_bitmask(logits, bitmask);
  return true;
}

// `ahead`: the row samples the token that many positions after the committed output.
std::vector<int32_t> Engine::suppressed_ids(const Sequence& seq, size_t ahead) const {
  if (static_cast<int64_t>(seq.output.size() + ahead) >= seq.params.min_tokens) return {};
  std::vector<int32_t> ids = seq.params.stop_token_ids;
  if (!seq.params.ignore_eos) ids.insert(ids.end(), options_.eos_ids.begin(), options_.eos_ids.end());
  return ids;
}

EngineEvent Engine::base_event(const Sequence& seq, EventKind kind) const {
  EngineEvent event;
  event.request_id = seq.id;
  event.kind = kind;
  event.prompt_tokens = seq.prompt_len();
  event.cached_tokens = seq.cached_tokens;
  event.prompt_processed = std::min(seq.cached, seq.prompt_len());
  event.completion_tokens = static_cast<int32_t>(seq.output.size());
  const auto now = EngineClock::now();
  event.scheduling.preemptions = seq.pauses;
  event.scheduling.replayed_tokens = seq.replayed_tokens;
  event.scheduling.paused_ms = seq.paused_ms;
  if (seq.phase == Phase::Pending && seq.ever_admitted) event.scheduling.paused_ms += elapsed_ms(seq.paused_at, now);
  if (seq.phase == Phase::Pending) {
    event.timings.queue_ms = elapsed_ms(seq.submitted, now);
  } else {
    event.timings.queue_ms = elapsed_ms(seq.submitted, seq.admitted);
    if (seq.phase == Phase::Prefilling) {
      event.timings.prompt_ms = elapsed_ms(seq.admitted, now);
    } else {
      event.timings.prompt_ms = elapsed_ms(seq.admitted, seq.prefilled);
      event.timings.predicted_ms = elapsed_ms(seq.prefilled, std::max(seq.prefilled, seq.last_commit));
      event.timings.decode_share_ms = seq.decode_share_ms;
    }
  }
  event.timings.draft_n = seq.draft_n;
  event.timings.draft_n_accepted = seq.draft_n_accepted;
  return event;
}

EngineEvent Engine::transition_event(const Sequence& seq, const char* name, const char* route) const {
  EngineEvent event;
  event.request_id = seq.id;
  event.kind = EventKind::Scheduling;
  SchedulingTransition t;
  t.name = name;
  t.preemption_index = seq.pauses;
  if (route != nullptr) t.route = route;
  const auto now = EngineClock::now();
  t.steady_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  t.elapsed_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - seq.submitted).count();
  const uint64_t replayed = tokens_replayed_.load();
  t.global = {tokens_prefilled_.load() - std::min(replayed, tokens_prefilled_.load()), decode_tokens_.load(), replayed};
  t.request = {static_cast<uint64_t>(seq.prefilled_tokens),
               static_cast<uint64_t>(std::max<int64_t>(static_cast<int64_t>(seq.output.size()) - 1, 0)),
               static_cast<uint64_t>(seq.replayed_tokens)};
  event.transition = std::move(t);
  return event;
}

void Engine::finish(Sequence& seq, EngineEvent& event, FinishReason reason) const {
  seq.phase = Phase::Finished;
  event.finished = true;
  event.finish_reason = reason;
  event.completion_tokens = static_cast<int32_t>(seq.output.size());
  event.speculative = seq.spec_tally;
  if (seq.constraint) event.constraint = seq.constraint->settle();
  count_outcome(event);
}

void Engine::count_outcome(const EngineEvent& event) const {
  if (event.kind == EventKind::QueueTimeout) {
    queue_timeouts_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  switch (event.finish_reason) {
    case FinishReason::Stop: finished_stop_.fetch_add(1, std::memory_order_relaxed); break;
    case FinishReason::Length: finished_length_.fetch_add(1, std::memory_order_relaxed); break;
    case FinishReason::Cancelled: finished_cancelled_.fetch_add(1, std::memory_order_relaxed); break;
    case FinishReason::Error: finished_error_.fetch_add(1, std::memory_order_relaxed); break;
    case FinishReason::None: break;
  }
}

void Engine::retire(Sequence& seq) {
  const uint64_t id = seq.id;
  auto owner = live_.find(id);
  std::shared_ptr<Sequence> keep;
  if (owner != live_.end()) {
    keep = std::move(owner->second);
    live_.erase(owner);
  }
  scheduler_.release(seq);
  requests_finished_.fetch_add(1, std::memory_order_relaxed);
}

void Engine::run() {
  try {
    while (true) {
      std::vector<EngineEvent> events;
      if (!step_boundary(events)) break;
      events_.push(std::move(events));
      worker_time_.lap(HostPhase::EngineBoundary);
      if (step_.empty()) continue;
      std::vector<EngineEvent> outputs;
      execute_step(outputs);
      events_.push(std::move(outputs));
      worker_time_.lap(HostPhase::EngineCommitOutput);
      if (consecutive_failures_ >= kMaxConsecutiveFailures) {
        fail_everything("the engine stopped after " + std::to_string(kMaxConsecutiveFailures) +
                        " failed steps in a row; last error: " + failure_);
        return;
      }
    }
  } catch (const DeviceFatalError& e) {
    fail_device(e.what());
    return;
  } catch (const std::exception& e) {
    fail_everything(std::string("worker crash: ") + e.what());
    return;
  }
  fail_everything("the engine is shutting down");
}

bool Engine::step_boundary(std::vector<EngineEvent>& events) {
  std::unique_lock lock(mu_);
  wake_.wait(lock, [&] { return stopping_ || !scheduler_.idle(); });
  if (stopping_) return false;
  worker_time_.restart();  // the wait (idle, or for the lock) is no work of the worker's
  const auto now = EngineClock::now();
  for (auto& seq : scheduler_.take_expired(now)) {
    EngineEvent event = base_event(*seq, EventKind::QueueTimeout);
    finish(*seq, event, FinishReason::Error);
    event.error = "the request waited " + std::to_string(options_.pending_timeout_ms) +
                  " ms for a lane without being admitted";
    events.push_back(std::move(event));
    retire(*seq);
  }
  for (Sequence* seq : scheduler_.resident()) {
    if (!seq->cancel_requested) continue;
    EngineEvent event = base_event(*seq, EventKind::Output);
    finish(*seq, event, FinishReason::Cancelled);
    events.push_back(std::move(event));
    retire(*seq);
  }
  for (Sequence* seq : scheduler_.admit(now)) {
    model_->reset_lane(seq->lane);
    restore_prefix(*seq);
    if (seq->ever_admitted) {  // a paused request restored: no second admission
      seq->paused_ms += elapsed_ms(seq->paused_at, now);
      replay_restores_.fetch_add(1, std::memory_order_relaxed);
      seq->replay_pending = true;
      events.push_back(transition_event(*seq, "restore_started", "replay"));
      events.push_back(transition_event(*seq, "restored", "replay"));
      continue;
    }
    seq->ever_admitted = true;
    requests_admitted_.fetch_add(1, std::memory_order_relaxed);
    prompt_tokens_.fetch_add(static_cast<uint64_t>(seq->prompt_len()), std::memory_order_relaxed);
    prompt_tokens_cached_.fetch_add(static_cast<uint64_t>(seq->cached_tokens), std::memory_order_relaxed);
    events.push_back(base_event(*seq, EventKind::Admitted));
  }
  if (speculating()) choose_drafts();
  scheduler_.plan(step_);
  step_.batch.hidden_out = mtp_ ? hidden_.data() : nullptr;
  for (Sequence* seq : scheduler_.take_paused_now()) {
    events.push_back(transition_event(*seq, "pause_started", nullptr));
    events.push_back(transition_event(*seq, "paused", "replay"));
  }
  int32_t prefilling = 0, decode_ready = 0, replaying = 0;
  for (const Sequence* seq : scheduler_.resident()) {
    if (seq->phase == Phase::Prefilling) ++prefilling;
    if (seq->phase == Phase::Prefilling && seq->replay_pending) ++replaying;
    if (seq->phase == Phase::Decoding) ++decode_ready;
  }
  prefilling_gauge_ = prefilling;
  decode_ready_gauge_ = decode_ready;
  replaying_gauge_ = replaying;
  return true;
}

void Engine::execute_step(std::vector<EngineEvent>& events) {
  std::string error;
  bool out_of_memory = false;
  const bool on_device = samples_on_device();
  const auto started = EngineClock::now();
  try {
    throw_if_injected();
    if (on_device) plan_device_sampling();
    worker_time_.lap(HostPhase::ProgramSubmit);
    if (on_device) {
      model_->forward_sampled(step_.batch, sampling_, sampled_ids_.data());
    } else {
      model_->forward(step_.batch, logits_.data());
    }
  } catch (const DeviceFatalError&) {
    throw;  // not a failed unit: the device is unusable (run() stops the engine)
  } catch (const std::exception& e) {
    error = e.what();
    out_of_memory = is_out_of_memory(e);
  }
  worker_time_.lap_device_wait();  // the forward: the backend returns once the device is done
  std::vector<Sequence*> done;
  steps_.fetch_add(1, std::memory_order_relaxed);
  if (!error.empty()) {
    ++consecutive_failures_;
    failures_gauge_ = consecutive_failures_;
    (out_of_memory ? recoveries_out_of_memory_ : recoveries_failed_step_).fetch_add(1, std::memory_order_relaxed);
    {
      std::lock_guard lock(mu_);
      failure_ = error;
    }
    for (Sequence* seq : step_.rows) {
      EngineEvent event = base_event(*seq, EventKind::Output);
      finish(*seq, event, FinishReason::Error);
      event.error = (out_of_memory ? "model step failed: out of memory: " : "model step failed: ") + error;
      events.push_back(std::move(event));
      done.push_back(seq);
    }
    worker_time_.lap(HostPhase::ProgramPost);
  } else {
    consecutive_failures_ = 0;
    failures_gauge_ = 0;
    decode_rows_.fetch_add(static_cast<uint64_t>(step_.decode_rows), std::memory_order_relaxed);
    tokens_prefilled_.fetch_add(static_cast<uint64_t>(step_.prefill_tokens), std::memory_order_relaxed);
    // Prefill slices below the frontier a paused request had reached are replay (a
    // recomputation), the rest initial prefill; and the boundaries of recovering requests.
    // Published before the unit's outputs, so that a request's finished event stays last.
    uint64_t replayed = 0;
    std::vector<std::pair<Sequence*, const char*>> marks;  // published once counted
    for (int32_t i = 0; i < step_.decode_rows; ++i) {
      Sequence& seq = *step_.rows[static_cast<size_t>(i)];
      if (!seq.recovering) continue;  // a decode row after a replay: its first fresh unit
      seq.recovering = false;
      marks.emplace_back(&seq, "recovery_complete");
    }
    for (size_t i = static_cast<size_t>(step_.decode_rows); i < step_.rows.size(); ++i) {
      Sequence& seq = *step_.rows[i];
      const int32_t count = step_.batch.slices[i].num_tokens;
      const int32_t start = seq.cached, end = start + count, high = seq.computed_high;
      const int32_t replay = std::clamp(high - start, 0, count);
      seq.replayed_tokens += replay;
      seq.prefilled_tokens += count - replay;
      replayed += static_cast<uint64_t>(replay);
      if (seq.replay_pending && end >= high) {
        seq.replay_pending = false;
        marks.emplace_back(&seq, "replay_complete");
        seq.recovering = end == high;  // else this slice already holds fresh prompt
        if (!seq.recovering) marks.emplace_back(&seq, "recovery_complete");
      } else if (seq.recovering && count > replay) {
        seq.recovering = false;
        marks.emplace_back(&seq, "recovery_complete");
      }
    }
    tokens_replayed_.fetch_add(replayed, std::memory_order_relaxed);
    for (const auto& [seq, name] : marks) events.push_back(transition_event(*seq, name, "replay"));
    if (step_.decode_rows > 0) {
      decode_rounds_.fetch_add(1, std::memory_order_relaxed);
      const double share = elapsed_ms(started, EngineClock::now()) / (step_.decode_rows + step_.prefill_tokens);
      for (int32_t i = 0; i < step_.decode_rows; ++i) step_.rows[static_cast<size_t>(i)]->decode_share_ms += share;
    }
    worker_time_.lap(HostPhase::ProgramPost);
    commit_step(events, done, on_device);
    worker_time_.lap(HostPhase::EngineCommitOutput);
    if (mtp_) {
      draft_with_mtp(done);
      worker_time_.lap(HostPhase::ProgramPost);
    }
  }
  if (done.empty()) return;
  std::lock_guard lock(mu_);
  for (Sequence* seq : done) retire(*seq);
  worker_time_.lap(HostPhase::EngineMaintenance);
}

void Engine::plan_device_sampling() {
  sampling_.clear();
  dead_ends_.clear();
  std::vector<int32_t> tokens, counts;
  std::vector<uint32_t> mask;
  for (size_t i = 0; i < step_.rows.size(); ++i) {
    const SeqSlice& slice = step_.batch.slices[i];
    if (!slice.wants_logits) continue;
    Sequence& seq = *step_.rows[i];
    const SamplingParams& p = seq.params.sampling;
    // Row r of a verified slice samples the token after r of the proposals: its penalties
    // count them as if committed, min_tokens counts its own position, and its grammar mask is
    // the matcher's after them (advanced here, rolled back below).
    TokenCounts ahead;
    int advanced = 0;
    bool off_grammar = false;  // a proposal the grammar rejects: later rows are never committed
    for (int32_t r = 0; r < slice.logit_rows(); ++r) {
      if (r > 0) ++ahead[seq.drafts[static_cast<size_t>(r - 1)]];
      RowSampling row;
      row.temperature = p.temperature;
      row.top_p = p.top_p;
      row.min_p = p.min_p;
      row.presence_penalty = p.presence_penalty;
      row.frequency_penalty = p.frequency_penalty;
      row.top_k = p.top_k;
      // A forced thinking-close token draws nothing, as on the host path.
      const bool draws = p.temperature > 0.0f && !seq.thinking.forcing_next();
      row.uniform = !draws ? 0.0 : speculating() ? peek_draw(seq, static_cast<size_t>(r)) : seq.sampler.next_draw();
      tokens.clear();
      counts.clear();
      if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
        TokenCounts merged = seq.output_counts;
        for (const auto& [token, count] : ahead) merged[token] += count;
        for (const auto& [token, count] : merged) {
          tokens.push_back(token);
          counts.push_back(count);
        }
      }
      // A constrained row's mask goes up with the batch; the device sampler applies it.
      mask.clear();
      bool dead_end = false;
      if (seq.constrained_now() && !off_grammar) {
        mask.resize(static_cast<size_t>(seq.constraint->bitmask_words()));
        dead_end = seq.constraint->fill_next_mask(mask) == 0;
      }
      dead_ends_.push_back(dead_end ? 1 : 0);
      sampling_.add_row(row, tokens, counts, suppressed_ids(seq, static_cast<size_t>(r)), mask);
      // choose_drafts keeps a constraint's start token out of the proposals, so an inactive
      // constraint stays inactive over the whole round.
      if (r + 1 < slice.logit_rows() && seq.constrained_now() && !off_grammar) {
        if (seq.constraint->accept(seq.drafts[static_cast<size_t>(r)])) ++advanced;
        else off_grammar = true;
      }
    }
    if (advanced > 0) seq.constraint->rollback(advanced);
  }
  sampled_ids_.assign(sampling_.rows.size(), kSampledNothing);
}

void Engine::commit_step(std::vector<EngineEvent>& events, std::vector<Sequence*>& done, bool sampled_on_device) {
  const auto now = EngineClock::now();
  struct Row {
    Sequence* seq;
    const SeqSlice* slice;
    int logit_row;  // -1: the slice asked for no logits
    EngineEvent event;
  };
  std::vector<Row> rows;  // rows that report this step, in plan order
  int logit_rows = 0;
  std::unique_lock cache_lock(mu_);  // the cache and pool bookkeeping are read by stats()
  for (size_t i = 0; i < step_.rows.size(); ++i) {
    Sequence& seq = *step_.rows[i];
    const SeqSlice& slice = step_.batch.slices[i];
    seq.round_committed = 0;
    const int logit_row = slice.wants_logits ? logit_rows : -1;
    logit_rows += slice.logit_rows();
    seq.cached += slice.num_tokens;
    if (!slice.keep_states) cache_step(seq);  // a verified row publishes after settle_round
    if (seq.cancel_requested) {
      rows.push_back({&seq, &slice, -1, base_event(seq, EventKind::Output)});
      finish(seq, rows.back().event, FinishReason::Cancelled);
      continue;
    }
    if (seq.phase == Phase::Prefilling) {
      if (seq.cached < seq.prefill_target()) {  // more prompt to go: only progress to report
        if (seq.params.report_progress) events.push_back(base_event(seq, EventKind::PromptProgress));
        continue;
      }
      seq.phase = Phase::Decoding;
      if (seq.replaying()) continue;  // restored after a pause: its tokens were reported already
      seq.prefilled = now;
    }
    seq.last_commit = now;
    rows.push_back({&seq, &slice, logit_row, base_event(seq, EventKind::Output)});
    if (logit_row < 0) finish(seq, rows.back().event, FinishReason::Length);  // max_tokens 0: prompt only
  }
  cache_lock.unlock();

  // Rows are independent (own sampler, history and stop state), so they sample in parallel.
  sampling_pool_.parallel_for(static_cast<int64_t>(rows.size()), [&](int64_t r) {
    Row& row = rows[static_cast<size_t>(r)];
    if (row.event.finished) return;
    commit_row(*row.seq, *row.slice, row.logit_row, row.event, sampled_on_device);
  });

  // Verified rows keep the state of their accepted prefix (a backend call: one row at a time).
  cache_lock.lock();
  for (auto& row : rows)
    if (row.slice->keep_states && row.seq->round_committed > 0) settle_round(*row.seq, *row.slice);
  cache_lock.unlock();

  for (auto& row : rows) {
    if (row.event.finished) done.push_back(row.seq);
    events.push_back(std::move(row.event));
  }
}

void Engine::commit_token(Sequence& seq, int32_t token, EngineEvent& event) const {
  seq.output.push_back(token);
  seq.history.push_back(token);
  ++seq.output_counts[token];
  seq.thinking.observe(token);
  event.token_ids.push_back(token);
  event.completion_tokens = static_cast<int32_t>(seq.output.size());
  // Stops are live once min_tokens tokens precede this one.
  const bool stops_live = static_cast<int32_t>(seq.output.size()) > seq.params.min_tokens;
  if (stops_live && contains(seq.params.stop_token_ids, token)) {
    event.text += seq.stops.flush();
    event.stop_kind = StopKind::TokenId;
    event.stop_token = token;
    finish(seq, event, FinishReason::Stop);
    return;
  }
  if (stops_live && !seq.params.ignore_eos && is_eos(token)) {
    event.text += seq.stops.flush();
    event.stop_kind = StopKind::Eos;
    event.stop_token = token;
    finish(seq, event, FinishReason::Stop);
    return;
  }
  static const std::string kNoBytes;
  const std::string& bytes =
      token < static_cast<int32_t>(token_bytes_.size()) ? token_bytes_[static_cast<size_t>(token)] : kNoBytes;
  auto pushed = seq.stops.push(bytes, stops_live);
  event.text += pushed.released;
  if (pushed.matched) {
    event.stop_kind = StopKind::String;
    event.stop_string = seq.stops.stops()[*pushed.matched];
    finish(seq, event, FinishReason::Stop);
    return;
  }
  if (static_cast<int32_t>(seq.output.size()) >= seq.output_cap) {
    event.text += seq.stops.flush();
    finish(seq, event, FinishReason::Length);
  }
}

int32_t Engine::context_ceiling() const {
  return static_cast<int32_t>(std::min<int64_t>(options_.max_context, pool_->capacity_tokens()));
}

void Engine::restore_prefix(Sequence& seq) {
  seq.cached = 0;
  seq.chain = {};
  if (cache_) {
    // At least one token is forwarded, so the last one's logits (or a replay's state) exist.
    if (host_) restore_from_host(seq, seq.prefill_target() - 1);
    PrefixCache::Hit hit = cache_->lookup(seq.history, seq.prefill_target() - 1);
    if (hit.tokens > 0) {
      seq.pages = std::move(hit.pages);
      seq.cached = hit.tokens;
      seq.chain = hit.chain;
      model_->resume_lane(seq.lane, hit.tokens, hit.snapshot_slot);
    }
  }
  if (!seq.ever_admitted) {
    seq.cached_tokens = seq.cached;
    plan_taps(seq);
  }
}

// Prefill snapshots for a model with recurrent state: the last block boundary of the prompt
// (a later turn that keeps this prompt resumes there) and a ladder back from it at P - G·2^k
// (a later prompt that diverges D tokens before P recomputes at most about max(D, G)), each at
// least the minimum gap from the others and from the hit. Block-aligned, so a snapshot always
// sits at the end of a cached block.
void Engine::plan_taps(Sequence& seq) const {
  seq.taps.clear();
  if (!cache_ || !cache_->needs_snapshots() || options_.taps_per_request <= 0) return;
  const auto floor_block = [](int64_t x) { return static_cast<int32_t>(x / kPageTokens * kPageTokens); };
  const int32_t prompt = seq.prompt_len(), hit = seq.cached;
  std::vector<int32_t> taps;
  auto add = [&](int32_t t) {
    if (t > hit && t <= prompt && std::find(taps.begin(), taps.end(), t) == taps.end() &&
        static_cast<int32_t>(taps.size()) < options_.taps_per_request)
      taps.push_back(t);
  };
  // Hints first, latest first: they mark where a later prompt is expected to diverge.
  std::vector<int32_t> hints = seq.params.cache_candidates;
  std::sort(hints.rbegin(), hints.rend());
  for (int32_t c : hints) add(floor_block(c));
  add(floor_block(prompt));
  for (int64_t g = options_.tap_ladder; static_cast<int32_t>(taps.size()) < options_.taps_per_request; g *= 2) {
    const int32_t t = floor_block(prompt - g);
    if (t <= hit) break;
    bool near = t - hit < options_.tap_min_gap;
    for (int32_t k : taps) near = near || std::abs(k - t) < options_.tap_min_gap;
    if (!near) taps.push_back(t);
  }
  if (static_cast<int32_t>(taps.size()) > options_.taps_per_request) taps.resize(options_.taps_per_request);
  std::sort(taps.begin(), taps.end());
  seq.taps = std::move(taps);
}

void Engine::cache_step(Sequence& seq) {
  if (!cache_) return;
  cache_->publish(seq.history, seq.cached, seq.pages, seq.chain);
  if (!cache_->needs_snapshots() || seq.chain.blocks < 0) return;
  while (!seq.taps.empty() && seq.taps.front() < seq.cached) seq.taps.erase(seq.taps.begin());
  if (seq.cached % kPageTokens != 0 || seq.chain.blocks * kPageTokens != seq.cached) return;
  bool endpoint = false;
  if (seq.phase == Phase::Prefilling) {
    if (seq.taps.empty() || seq.taps.front() != seq.cached) return;
    seq.taps.erase(seq.taps.begin());
  } else if (seq.phase == Phase::Decoding || seq.phase == Phase::Finished) {
    // (Finished: a speculative round that ended the request settles after its commit.)
    // Decode endpoints roll: the state at the request's latest block boundary, so the next
    // turn of a conversation resumes near where this answer ended.
    endpoint = true;
  } else {
    return;
  }
  const uint64_t key = seq.chain.key;
  if (cache_->has_snapshot(key)) return;
  const int slot = cache_->acquire_slot();
  if (slot < 0) {
    cache_->count_snapshot(endpoint, false);
    return;
  }
  model_->save_snapshot(seq.lane, slot);
  cache_->attach_snapshot(key, slot);
  cache_->count_snapshot(endpoint, true);
  if (endpoint) {
    if (seq.endpoint_key != 0 && seq.endpoint_key != key) cache_->drop_snapshot(seq.endpoint_key);
    seq.endpoint_key = key;
  }
}

void Engine::fail_everything(const std::string& message) {
  std::vector<EngineEvent> events;
  {
    std::lock_guard lock(mu_);
    if (message.rfind("the engine is shutting down", 0) != 0) {
      healthy_ = false;
      failure_ = message;
    }
    stopping_ = true;
    for (auto& seq : scheduler_.take_all_pending()) {
      EngineEvent event = base_event(*seq, EventKind::Output);
      finish(*seq, event, FinishReason::Error);
      event.error = message;
      events.push_back(std::move(event));
      retire(*seq);
    }
    for (Sequence* seq : scheduler_.resident()) {
      EngineEvent event = base_event(*seq, EventKind::Output);
      finish(*seq, event, FinishReason::Error);
      event.error = message;
      events.push_back(std::move(event));
      retire(*seq);
    }
  }
  events_.push(std::move(events));
}

}  // namespace ninfer
