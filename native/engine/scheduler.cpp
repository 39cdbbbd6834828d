#include "engine/scheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ninfer {

Scheduler::Scheduler(int num_lanes, int32_t prefill_chunk, KvPool& pool)
    : prefill_chunk_(prefill_chunk), pool_(pool), lanes_(static_cast<size_t>(num_lanes)) {
  if (num_lanes < 1) throw std::invalid_argument("scheduler needs at least one lane");
  if (prefill_chunk < 1) throw std::invalid_argument("prefill_chunk must be positive");
}

void Scheduler::enqueue(std::shared_ptr<Sequence> seq) { pending_.push_back(std::move(seq)); }

std::shared_ptr<Sequence> Scheduler::remove_pending(uint64_t id) {
  auto it = std::find_if(pending_.begin(), pending_.end(), [id](const auto& s) { return s->id == id; });
  if (it == pending_.end()) return nullptr;
  auto seq = std::move(*it);
  pending_.erase(it);
  return seq;
}

std::vector<std::shared_ptr<Sequence>> Scheduler::take_expired(EngineClock::time_point now) {
  std::vector<std::shared_ptr<Sequence>> expired;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if ((*it)->deadline && *(*it)->deadline <= now) {
      expired.push_back(std::move(*it));
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  return expired;
}

std::vector<std::shared_ptr<Sequence>> Scheduler::take_all_pending() {
  std::vector<std::shared_ptr<Sequence>> all(std::make_move_iterator(pending_.begin()),
                                             std::make_move_iterator(pending_.end()));
  pending_.clear();
  return all;
}

std::vector<Sequence*> Scheduler::admit(EngineClock::time_point now) {
  std::vector<Sequence*> admitted;
  for (size_t lane = 0; lane < lanes_.size() && !pending_.empty(); ++lane) {
    if (lanes_[lane]) continue;
    auto seq = std::move(pending_.front());
    pending_.pop_front();
    seq->lane = static_cast<int>(lane);
    seq->phase = Phase::Prefilling;
    seq->admitted = now;
    seq->deadline.reset();
    admitted.push_back(seq.get());
    lanes_[lane] = std::move(seq);
    ++running_;
  }
  return admitted;
}

std::vector<Sequence*> Scheduler::resident() const {
  std::vector<Sequence*> out;
  for (const auto& s : lanes_)
    if (s) out.push_back(s.get());
  std::sort(out.begin(), out.end(), [](const Sequence* a, const Sequence* b) { return a->id < b->id; });
  return out;
}

void Scheduler::ensure_pages(Sequence& seq, int32_t tokens) {
  const int64_t needed = (tokens + kPageTokens - 1) / kPageTokens;
  const int64_t missing = needed - static_cast<int64_t>(seq.pages.size());
  if (missing <= 0) return;
  auto pages = pool_.allocate(missing);
  if (!pages) {
    throw std::runtime_error("KV pool exhausted: request " + std::to_string(seq.id) + " needs " +
                             std::to_string(missing) + " more pages, " +
                             std::to_string(pool_.free_pages()) + " free");
  }
  seq.pages.insert(seq.pages.end(), pages->begin(), pages->end());
}

void Scheduler::plan(StepPlan& step) {
  step.batch.slices.clear();
  step.tokens.clear();
  step.rows.clear();
  step.decode_rows = 0;
  step.prefill_tokens = 0;
  const auto order = resident();

  auto add_slice = [&](Sequence& seq, const int32_t* tokens, int32_t count, bool wants_logits) {
    ensure_pages(seq, seq.cached + count);
    SeqSlice slice;
    slice.lane = seq.lane;
    slice.start_pos = seq.cached;
    slice.num_tokens = count;
    slice.page_table = seq.pages.data();
    slice.num_pages = static_cast<int32_t>(seq.pages.size());
    slice.wants_logits = wants_logits;
    step.batch.slices.push_back(slice);
    step.tokens.insert(step.tokens.end(), tokens, tokens + count);
    step.rows.push_back(&seq);
  };

  for (Sequence* seq : order) {
    if (seq->phase != Phase::Decoding) continue;
    add_slice(*seq, &seq->output.back(), 1, true);
    if (!seq->drafts.empty()) {  // a speculative round: verify every proposal in this traversal
      const auto count = static_cast<int32_t>(seq->drafts.size());
      ensure_pages(*seq, seq->cached + 1 + count);
      SeqSlice& slice = step.batch.slices.back();
      slice.num_tokens += count;
      slice.page_table = seq->pages.data();
      slice.num_pages = static_cast<int32_t>(seq->pages.size());
      slice.all_logits = true;
      slice.keep_states = true;
      step.tokens.insert(step.tokens.end(), seq->drafts.begin(), seq->drafts.end());
    }
    ++step.decode_rows;
  }
  int32_t budget = prefill_chunk_;
  for (Sequence* seq : order) {
    if (seq->phase != Phase::Prefilling || budget == 0) continue;
    const int32_t count = std::min(budget, seq->prompt_left());
    const bool completes = count == seq->prompt_left();
    add_slice(*seq, seq->params.prompt.data() + seq->cached, count, completes && seq->output_cap > 0);
    budget -= count;
    step.prefill_tokens += count;
  }
  step.batch.tokens = step.tokens;
}

void Scheduler::reserve(Sequence& seq, int32_t tokens) { ensure_pages(seq, tokens); }

void Scheduler::release(Sequence& seq) {
  if (!seq.pages.empty()) pool_.release(seq.pages);
  seq.pages.clear();
  const int lane = seq.lane;
  seq.lane = -1;
  if (lane >= 0 && lanes_[static_cast<size_t>(lane)].get() == &seq) {
    // The lane may hold the last reference: `seq` must not be touched after this.
    lanes_[static_cast<size_t>(lane)].reset();
    --running_;
  }
}

}  // namespace ninfer
