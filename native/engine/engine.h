// The engine: one worker thread that admits requests into lanes, runs one model traversal per
// step, samples, applies stops, and publishes events.
//
// Threads: submit/cancel/drain_events/stats may be called from any thread. The worker never
// calls back into the caller; it publishes through the EventQueue, whose fd() the caller
// polls. Every accepted request ends with exactly one finished event (Output with
// finished=true, or QueueTimeout).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/kv_format.h"

#include "cache/host_tier.h"
#include "cache/kv_pool.h"
#include "cache/prefix_cache.h"
#include "common/thread_pool.h"
#include "engine/engine_event.h"
#include "engine/event_queue.h"
#include "engine/grammar_compiler.h"
#include "engine/generation_params.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/worker_time.h"
#include "models/model.h"

namespace ninfer {

class MtpHead;

// The error of a constrained request whose output has no legal continuation (the server
// matches the prefix).
inline constexpr const char* kDeadEndError =
    "constraint_dead_end: the output so far has no legal next token under its constraint";

// Speculative decoding (docs/engine.md): proposals verified in one target traversal per round.
struct SpeculativeOptions {
  int32_t mtp_draft_tokens = 0;    // MTP head proposals per round, 1..5; 0 = no MTP drafting
  int32_t ngram_draft_tokens = 0;  // n-gram copy proposals per round, 1..63; 0 = none
  int32_t ngram_min_match = 12;    // matched suffix tokens an n-gram proposal needs, 4..64
  // --lm-head-draft: MTP drafts score token ids below this only (ModelOptions::proposal_vocab);
  // 0 = the full lm_head. Verification always scores the full vocabulary.
  int32_t lm_head_draft_tokens = 0;
  // Drafting stops while a step decodes more rows than this (0 = no limit; -1 = auto, resolved
  // by open_engine: 3 on MoE artifacts, whose verification rounds read many more experts than a
  // plain step, and no limit on dense ones). Rows decode one token each meanwhile; exact as ever.
  int32_t max_batch = -1;
  bool enabled() const { return mtp_draft_tokens > 0 || ngram_draft_tokens > 0; }
  int32_t max_drafts() const { return mtp_draft_tokens > ngram_draft_tokens ? mtp_draft_tokens : ngram_draft_tokens; }
};

// Why a SpeculativeOptions is unusable ("" when it is fine).
std::string speculative_options_problem(const SpeculativeOptions& spec);

struct EngineOptions {
  int max_concurrency = 1;         // resident lanes, 1..8
  int32_t max_context = 0;         // per-request ceiling on prompt + output tokens (> 0)
  int32_t prefill_chunk = 512;     // prompt tokens per step
  int32_t max_pending = 16;        // requests allowed to wait for a lane
  int64_t pending_timeout_ms = 0;  // 0 = a pending request waits until a lane frees
  std::vector<int32_t> eos_ids;    // end-of-sequence ids of the model (merged)
  bool device_sampling = true;     // sample on the model's device when it can (only the
                                   // chosen ids come back); false keeps host sampling
  SpeculativeOptions spec;
  // Shared KV pool, in tokens: 0 = auto (the memory the model leaves, less the headroom).
  int64_t kv_capacity = 0;
  KvDType kv_dtype = KvDType::BF16;  // --kv-dtype: how the pool stores K and V
  int64_t vram_headroom_mib = 1024;  // auto: memory left free after sizing the pool
  bool prefix_reuse = true;          // reuse cached prefixes across requests
  // Host tier of the prefix cache (engine/engine_host_tier.cpp): bytes of host memory that
  // blocks and snapshots evicted from the device share; 0 keeps the cache on the device.
  int64_t host_context_bytes = 0;
  // Hybrid models (recurrent state): snapshot slots and prefill taps; 0 / -1 = the defaults.
  int32_t snapshot_slots = 0;        // default max_concurrency + 1 (+ 2 without a host tier)
  int32_t taps_per_request = -1;     // default 8 (2 without a host tier); 0 = only endpoints
  int32_t tap_ladder = 0;            // default max(4096, 2 * prefill_chunk)
  int32_t tap_min_gap = 0;           // default max(1024, prefill_chunk)
};

// Pages for every lane to reach max_context (the floor of automatic sizing).
int64_t kv_pages_for(const EngineOptions& options);
// Resolves the 0 / -1 snapshot and tap defaults above.
EngineOptions resolve_cache_defaults(EngineOptions options);

enum class SubmitStatus : uint8_t {
  Accepted,
  Overloaded,       // lanes and pending queue are full
  ContextExceeded,  // the prompt leaves no room under max_context
  InvalidRequest,   // a parameter is out of range; `message` names it
  Unavailable,      // the engine failed or is shutting down
};

struct SubmitResult {
  SubmitStatus status = SubmitStatus::Accepted;
  uint64_t request_id = 0;
  std::string message;
  int32_t prompt_tokens = 0;
  int32_t max_context = 0;
  uint64_t seed = 0;  // the sampler's seed (the request's, or the one drawn for it)
};

struct EngineStats {
  int32_t lanes = 0;
  int32_t running = 0;  // requests holding a lane
  int32_t pending = 0;  // requests waiting for one
  int64_t kv_pages_total = 0;
  int64_t kv_pages_free = 0;    // pages a request could take: free, or cached and unreferenced
  int64_t kv_pages_cached = 0;  // pages the prefix cache holds (mapped or not)
  int64_t kv_capacity_tokens = 0;
  int64_t kv_page_bytes = 0;  // one 64-token page, all layers, K and V, in the pool's format
  int32_t paused = 0;           // requests paused for memory, waiting to be restored
  uint64_t pauses = 0;
  uint64_t replay_restores = 0;  // paused requests re-admitted (each rebuilds by replay)
  uint64_t replayed_tokens = 0;  // tokens those replays recompute past their cached prefix
  bool prefix_reuse = false;
  PrefixCacheStats cache;
  HostTierStats host;               // capacity_bytes 0: no host tier
  uint64_t unbacked_node_losses = 0;  // device evictions of blocks with no host copy
  int64_t tree_blocks = 0;            // blocks on the device or only on the host (gauge)
  std::string cache_problem;    // stats(true): "" while the cache's invariants hold
  // Recurrent-state slots (hybrid models: one per lane; none for pure-attention models).
  int32_t state_slots_total = 0;
  int32_t state_slots_used = 0;
  uint64_t requests_admitted = 0;
  uint64_t requests_finished = 0;
  uint64_t tokens_prefilled = 0;
  uint64_t tokens_decoded = 0;  // sampled tokens, including each request's first
  uint64_t steps = 0;
  uint64_t decode_rows = 0;  // sum over steps of decode batch sizes
  int32_t consecutive_failures = 0;
  bool healthy = true;
  // Published by the worker at each step boundary (atomics: read without taking its lock).
  int32_t prefilling = 0;    // resident requests still reading their prompt
  int32_t decode_ready = 0;  // resident requests whose next step is a decode row
  // Counters since the engine started; readers subtract their own baseline.
  uint64_t prompt_tokens = 0;         // full prompt of each request, counted at admission
  uint64_t prompt_tokens_cached = 0;  // prompt tokens reused from a cache instead of prefilled
  uint64_t decode_tokens = 0;         // sampled tokens after each request's first
  uint64_t decode_rounds = 0;         // steps with at least one decode row
  uint64_t finished_stop = 0;         // request outcomes, one per accepted request
  uint64_t finished_length = 0;
  uint64_t finished_cancelled = 0;
  uint64_t finished_error = 0;
  uint64_t queue_timeouts = 0;
  uint64_t submits_refused = 0;  // overloaded or unavailable at submit (never accepted)
  uint64_t recoveries_out_of_memory = 0;  // failed units of work the engine carried on after
  uint64_t recoveries_failed_step = 0;
  // Speculative rounds: decode rows that verified proposals, the proposals, the accepted ones;
  // the ngram_* counters are the part whose proposals were n-gram copies.
  uint64_t spec_rounds = 0;
  uint64_t spec_draft_tokens = 0;
  uint64_t spec_accepted_tokens = 0;
  uint64_t spec_ngram_rounds = 0;
  uint64_t spec_ngram_draft_tokens = 0;
  uint64_t spec_ngram_accepted_tokens = 0;
  uint64_t spec_fallback_steps = 0;  // decode rows of a speculating engine with nothing to verify
  int32_t replaying = 0;  // resident requests rebuilding their state by replay after a pause
  // Worker wall time (engine/worker_time.h): host phases by HostPhase, and device wait.
  std::array<uint64_t, kHostPhases> host_work_ns{};
  uint64_t device_wait_ns = 0;
  // The part of device_wait_ns spent waiting for drafts (the MTP head's traversals) in batches
  // with a constrained request, whose masks wait on those proposals; once per batch.
  uint64_t constraint_draft_wait_ns = 0;
};

// What a prefix cache file save or load did.
struct CacheFileReport {
  bool ok = false;
  std::string message;  // why not, or what was done
  int64_t blocks = 0, snapshots = 0, bytes = 0;
};

class Engine {
 public:
  // Failed units of work in a row after which the engine gives up (spec: eight recoveries).
  static constexpr int kMaxConsecutiveFailures = 8;

  // `model` must have been built over `pool`; the engine owns both and drops the model first.
  // `keepalive` holds what the model's weights point into (the mapped artifact), if anything.
  // `token_bytes[id]` are the bytes token `id` stands for (stop strings match on them).
  Engine(std::unique_ptr<KvPool> pool, std::unique_ptr<Model> model, EngineOptions options,
         std::vector<std::string> token_bytes, std::shared_ptr<const void> keepalive = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  SubmitResult submit(GenerationParams params);
  // Idempotent. A pending request finishes at once; a running one at the next step boundary.
  // Either way it ends with a finished event whose reason is "cancelled". Unknown ids are ignored.
  void cancel(uint64_t request_id);
  std::vector<EngineEvent> drain_events() { return events_.drain(); }
  int event_fd() const { return events_.fd(); }
  // check_cache: also run the prefix cache's consistency check (O(blocks), under the lock).
  EngineStats stats(bool check_cache = false) const;
  bool healthy() const { return healthy_.load(); }
  // Fails every request with "the engine is shutting down" and joins the worker. Idempotent.
  void shutdown();
  // Test hook: the next `count` units of work (model steps) fail before the forward, as an
  // out-of-memory condition or as a failed internal check, through the real recovery path.
  void inject_step_failures(int count, bool out_of_memory);
  // Test hook: after `after_steps` more model steps, the next one fails with a fatal device
  // error (DeviceFatalError, as a CUDA illegal address would), through the real path. < 0 disarms.
  void inject_device_fault(int after_steps);
  // The fatal device error that stopped the engine ("" while there was none). Once set, the
  // device cannot be used again in this process (nothing is saved, the server exits).
  std::string device_failure() const;

  // The prefix cache file (engine/prefix_cache_file.cpp). Save: after shutdown, every cached
  // block and snapshot to PATH.tmp, then renamed over PATH (a cut save leaves PATH as it
  // was). Load: before the first submit, as many blocks and snapshots as the pool and slots
  // hold; a missing file, one written for another model, KV format or build, or a damaged one
  // restores nothing and says why.
  CacheFileReport save_prefix_cache(const std::string& path);
  CacheFileReport load_prefix_cache(const std::string& path);

  const EngineOptions& options() const { return options_; }
  const ModelInfo& model_info() const { return model_->info(); }
  // Whether steps sample on the model's device (only the chosen ids come back).
  bool samples_on_device() const { return options_.device_sampling && model_->samples_on_device(); }
  const std::vector<std::string>& token_bytes() const { return token_bytes_; }

  // Control tokens that no output constraint may produce (they are not text). Only before
  // the first grammars() call; throws std::logic_error after it.
  void set_grammar_special_ids(std::vector<int32_t> ids);
  // The compiler of output constraints over this engine's vocabulary, built on first use.
  // Thread-safe; compiles run on the caller's thread, never on the worker.
  GrammarCompiler& grammars();

 private:
  std::string validate(const GenerationParams& params) const;
  void run();
  // Under the lock: queue timeouts, cancellations, admissions, then the next plan. False once
  // the engine is stopping.
  bool step_boundary(std::vector<EngineEvent>& events);
  void execute_step(std::vector<EngineEvent>& events);
  // Fills sampling_ for the step's logit rows, drawing each sampling row's uniform value from
  // its sequence's generator (as the host Sampler would during commit_step) and computing
  // constrained rows' grammar masks, which the device sampler applies.
  void plan_device_sampling();
  // After a successful forward: advances every row, samples (or takes the ids sampled on the
  // device), applies stops. Thread-safe per row, so rows are committed on the sampling pool.
  void commit_step(std::vector<EngineEvent>& events, std::vector<Sequence*>& done, bool sampled_on_device);
  void commit_token(Sequence& seq, int32_t token, EngineEvent& event) const;
  // One decode or prefill row's commit: samples its logit rows in order and commits tokens
  // until a proposal is rejected or the request finishes (engine_speculation.cpp).
  void commit_row(Sequence& seq, const SeqSlice& slice, int logit_row, EngineEvent& event, bool sampled_on_device);
  // The next round's proposals of every decoding request (n-gram, or the MTP head's).
  void choose_drafts();
  bool drafting_paused(int32_t decode_rows) const;  // SpeculativeOptions::max_batch
  // After a committed step: the MTP head reads the step's hidden states and drafts ahead.
  void draft_with_mtp(const std::vector<Sequence*>& done);
  double peek_draw(Sequence& seq, size_t index) const;
  bool speculating() const { return options_.spec.enabled(); }
  // mu_ held, after a verified row committed: the lane keeps its accepted prefix (KV length,
  // pages past it returned, recurrent state rolled back), and the cache sees only that prefix.
  void settle_round(Sequence& seq, const SeqSlice& slice);
  // mu_ held: the admitted request's cached prefix (pages, and the state snapshot on a hybrid
  // model) and, at its first admission, its prefill taps.
  void restore_prefix(Sequence& seq);
  void plan_taps(Sequence& seq) const;
  // The host tier (engine/engine_host_tier.cpp). install: at construction, when enabled.
  // offload: the cache's eviction sink, copying what is worth keeping into the tier. restore:
  // before a lookup, copies the host part of the sequence's deepest usable prefix back into
  // fresh pages and a snapshot slot, so the lookup that follows finds it on the device.
  void install_host_tier();
  void offload_to_host(const PrefixCache::Evicted& evicted);
  void restore_from_host(const Sequence& seq, int32_t limit);
  // What the prefix cache file holds: every block of the device tree or the host tier with
  // its snapshot, parents first; each image is on the device (page, slot) or on the host.
  struct SavedBlock {
    uint64_t key = 0, parent = 0;
    std::vector<int32_t> tokens;
    int32_t page = -1;
    int slot = -1;
    const std::byte* host_page = nullptr;
    const float* host_snapshot = nullptr;
  };
  std::vector<SavedBlock> saved_blocks() const;
  // After a step: publishes full blocks, takes planned and decode-endpoint snapshots.
  void cache_step(Sequence& seq);
  // The ceiling of prompt + output: max_context, or the KV pool when it is smaller.
  int32_t context_ceiling() const;
  // `ahead`: the row samples the token that many positions after the committed output.
  std::vector<int32_t> suppressed_ids(const Sequence& seq, size_t ahead = 0) const;
  bool is_eos(int32_t token) const;
  // Masks `logits` with the sequence's grammar; false at a dead end (no token allowed).
  bool mask_constrained_row(Sequence& seq, std::span<float> logits) const;
  EngineEvent base_event(const Sequence& seq, EventKind kind) const;
  // A Scheduling event for `seq` at transition `name` (engine/engine_event.h).
  EngineEvent transition_event(const Sequence& seq, const char* name, const char* route) const;
  void finish(Sequence& seq, EngineEvent& event, FinishReason reason) const;
  void count_outcome(const EngineEvent& event) const;
  void throw_if_injected();
  // A fatal device error on the worker: fails everything and records why (see device_failure).
  void fail_device(const std::string& what);
  // Frees the lane and forgets the request; mu_ held. `seq` may be destroyed.
  void retire(Sequence& seq);
  void fail_everything(const std::string& message);

  std::shared_ptr<const void> keepalive_;
  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<Model> model_;
  const EngineOptions options_;
  const std::vector<std::string> token_bytes_;
  const int64_t vocab_size_;
  std::unique_ptr<PrefixCache> cache_;  // null with prefix reuse off
  std::unique_ptr<HostTier> host_;      // null without a host tier (or without cache_)
  uint64_t unbacked_node_losses_ = 0;   // mu_ held

  mutable std::mutex mu_;  // guards scheduler_, live_, pool_ bookkeeping, stopping_
  std::condition_variable wake_;
  Scheduler scheduler_;
  std::unordered_map<uint64_t, std::shared_ptr<Sequence>> live_;
  uint64_t next_id_ = 1;
  bool stopping_ = false;
  std::string failure_;  // why the engine stopped, once it has
  std::string device_failure_;  // a fatal device error, once one happened

  EventQueue events_;
  ThreadPool sampling_pool_;  // worker only: samples the rows of a step in parallel
  StepPlan step_;            // worker only
  std::vector<float> logits_;  // worker only
  SamplingBatch sampling_;     // worker only: this step's rows, when sampled on the device
  std::vector<int32_t> sampled_ids_;  // worker only: their chosen ids (or kSampled* codes)
  MtpHead* mtp_ = nullptr;            // the model's draft head when MTP drafting is on
  std::vector<float> hidden_;         // worker only: the step's final-normed hidden states
  std::vector<float> mtp_logits_, mtp_hidden_;  // worker only: MTP head outputs
  std::vector<uint8_t> dead_ends_;    // worker only: rows whose grammar mask allowed nothing
  int consecutive_failures_ = 0;  // worker only

  std::mutex grammar_mu_;  // guards grammars_ creation and grammar_special_ids_
  std::vector<int32_t> grammar_special_ids_;
  std::unique_ptr<GrammarCompiler> grammars_;

  std::atomic<bool> healthy_{true};
  std::atomic<uint64_t> requests_admitted_{0}, requests_finished_{0};
  std::atomic<uint64_t> tokens_prefilled_{0}, tokens_decoded_{0}, steps_{0}, decode_rows_{0};
  std::atomic<int32_t> failures_gauge_{0};
  std::atomic<int32_t> prefilling_gauge_{0}, decode_ready_gauge_{0};
  std::atomic<uint64_t> prompt_tokens_{0}, prompt_tokens_cached_{0}, decode_tokens_{0}, decode_rounds_{0};
  mutable std::atomic<uint64_t> finished_stop_{0}, finished_length_{0}, finished_cancelled_{0},
      finished_error_{0}, queue_timeouts_{0}, submits_refused_{0};
  std::atomic<uint64_t> recoveries_out_of_memory_{0}, recoveries_failed_step_{0};
  mutable std::atomic<uint64_t> spec_rounds_{0}, spec_draft_tokens_{0}, spec_accepted_tokens_{0},
      spec_ngram_rounds_{0}, spec_ngram_draft_tokens_{0}, spec_ngram_accepted_tokens_{0}, spec_fallback_steps_{0},
      constraint_draft_wait_ns_{0};
  std::atomic<uint64_t> replay_restores_{0}, tokens_replayed_{0};
  std::atomic<int32_t> replaying_gauge_{0};
  std::atomic<int> device_fault_after_{-1};
  std::atomic<int> injected_failures_{0};
  std::atomic<bool> injected_out_of_memory_{false};
  WorkerTime worker_time_;  // laps taken by the worker only; read by stats()

  std::thread worker_;  // last: starts after everything above is built
};

}  // namespace ninfer
