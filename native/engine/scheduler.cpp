#include "engine/scheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ninfer {

Scheduler::Scheduler(int num_lanes, int32_t prefill_chunk, KvPool& pool, PrefixCache* cache)
    : prefill_chunk_(prefill_chunk), pool_(pool), cache_(cache), lanes_(static_cast<size_t>(num_lanes)) {
  if (num_lanes < 1) throw std::invalid_argument("scheduler needs at least one lane");
  if (prefill_chunk < 1) throw std::invalid_argument("prefill_chunk must be positive");
}

int64_t Scheduler::available_pages() const {
  return pool_.free_pages() + (cache_ ? cache_->unreferenced_blocks() : 0);
}

void Scheduler::enqueue(std::shared_ptr<Sequence> seq) { pending_.push_back(std::move(seq)); }

std::shared_ptr<Sequence> Scheduler::remove_pending(uint64_t id) {
  for (auto* queue : {&pending_, &paused_}) {
    auto it = std::find_if(queue->begin(), queue->end(), [id](const auto& s) { return s->id == id; });
    if (it == queue->end()) continue;
    auto seq = std::move(*it);
    queue->erase(it);
    return seq;
  }
  return nullptr;
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
  std::vector<std::shared_ptr<Sequence>> all(std::make_move_iterator(paused_.begin()),
                                             std::make_move_iterator(paused_.end()));
  all.insert(all.end(), std::make_move_iterator(pending_.begin()), std::make_move_iterator(pending_.end()));
  paused_.clear();
  pending_.clear();
  return all;
}

bool Scheduler::fits(const Sequence& seq) const {
  const int32_t target = seq.prefill_target();
  const int32_t hit = cache_ ? cache_->probe(seq.history, target - 1) : 0;
  // A restore rebuilds the whole saved frontier and then decodes one token; a fresh request
  // needs its first prefill unit.
  const int32_t end = seq.replaying() ? target + 1 : std::min(target, hit + prefill_chunk_);
  int64_t need = (end + kPageTokens - 1) / kPageTokens - hit / kPageTokens;
  // A restore also leaves each resident a page to grow into, or the next step would pause
  // it again at once (replaying costs a whole prefill).
  if (seq.replaying()) need += running_;
  // The hit's blocks stop being evictable once mapped: count them against the cache's share.
  return need <= available_pages() - hit / kPageTokens;
}

std::vector<Sequence*> Scheduler::admit(EngineClock::time_point now) {
  std::vector<Sequence*> admitted;
  auto place = [&](std::deque<std::shared_ptr<Sequence>>& queue) {
    for (size_t lane = 0; lane < lanes_.size() && !queue.empty(); ++lane) {
      if (lanes_[lane]) continue;
      // With nothing resident every admissible request fits (submit checked the capacity).
      if (running_ > 0 && !fits(*queue.front())) return;
      auto seq = std::move(queue.front());
      queue.pop_front();
      seq->lane = static_cast<int>(lane);
      seq->phase = Phase::Prefilling;
      if (!seq->ever_admitted) seq->admitted = now;
      seq->deadline.reset();
      admitted.push_back(seq.get());
      lanes_[lane] = std::move(seq);
      ++running_;
    }
  };
  place(paused_);
  place(pending_);
  return admitted;
}

std::vector<Sequence*> Scheduler::resident() const {
  std::vector<Sequence*> out;
  for (const auto& s : lanes_)
    if (s) out.push_back(s.get());
  std::sort(out.begin(), out.end(), [](const Sequence* a, const Sequence* b) { return a->id < b->id; });
  return out;
}

bool Scheduler::reserve_pages(Sequence& seq, int32_t tokens) {
  const int64_t needed = (tokens + kPageTokens - 1) / kPageTokens;
  const int64_t missing = needed - static_cast<int64_t>(seq.pages.size());
  if (missing <= 0) return true;
  while (pool_.free_pages() < missing)
    if (!cache_ || !cache_->evict_one()) return false;
  auto pages = pool_.allocate(missing);
  seq.pages.insert(seq.pages.end(), pages->begin(), pages->end());
  return true;
}

void Scheduler::drop_pages(Sequence& seq) {
  if (!seq.pages.empty()) pool_.release(seq.pages);
  seq.pages.clear();
  seq.chain = {};
}

void Scheduler::pause(Sequence& seq) {
  // Full blocks are already in the cache (published after every step); the rest is rebuilt.
  seq.computed_high = std::max(seq.computed_high, seq.cached);
  drop_pages(seq);
  seq.cached = 0;
  seq.taps.clear();
  seq.endpoint_key = 0;
  seq.drafts.clear();  // the MTP head drafts again after the replay's last chunk
  seq.mtp_drafts.clear();
  seq.phase = Phase::Pending;
  ++seq.pauses;
  ++pauses_;
  seq.paused_at = EngineClock::now();
  paused_now_.push_back(&seq);
  const int lane = seq.lane;
  seq.lane = -1;
  auto owner = std::move(lanes_[static_cast<size_t>(lane)]);
  --running_;
  auto at = std::find_if(paused_.begin(), paused_.end(), [&](const auto& s) { return s->id > seq.id; });
  paused_.insert(at, std::move(owner));
}

void Scheduler::plan(StepPlan& step) {
  step.batch.slices.clear();
  step.tokens.clear();
  step.rows.clear();
  step.decode_rows = 0;
  step.prefill_tokens = 0;

  // Reserve in age order: what an older request needs is taken first, and a request the pool
  // cannot hold pauses the youngest resident (possibly itself), never the oldest.
  struct Unit {
    Sequence* seq;
    int32_t count;
  };
  std::vector<Unit> units;
  int32_t budget = prefill_chunk_;
  auto order = resident();
  for (size_t i = 0; i < order.size(); ++i) {
    Sequence* seq = order[i];
    if (!seq || seq->lane < 0) continue;  // paused earlier in this loop
    int32_t count = 1;
    if (seq->phase == Phase::Prefilling) {
      if (budget == 0) continue;
      count = std::min(budget, seq->prefill_left());
      if (!seq->taps.empty() && seq->taps.front() > seq->cached) count = std::min(count, seq->taps.front() - seq->cached);
    } else if (seq->phase != Phase::Decoding) {
      continue;
    }
    bool paused_self = false;
    while (!reserve_pages(*seq, seq->cached + count)) {
      // The youngest resident still in this plan's future (older ones already hold pages).
      size_t victim = order.size();
      for (size_t j = order.size(); j-- > i;)
        if (order[j] && order[j]->lane >= 0) {
          victim = j;
          break;
        }
      if (victim == 0 || victim == order.size())
        throw std::runtime_error("KV pool exhausted: request " + std::to_string(seq->id) + " alone needs " +
                                 std::to_string((seq->cached + count + kPageTokens - 1) / kPageTokens) +
                                 " pages of " + std::to_string(pool_.num_pages()));
      Sequence* v = order[victim];
      order[victim] = nullptr;
      pause(*v);
      if (victim == i) {
        paused_self = true;
        break;
      }
    }
    if (paused_self) continue;
    units.push_back({seq, count});
    if (seq->phase == Phase::Prefilling) budget -= count;
  }

  // Proposals only use pages every unit left free, so speculation never evicts or pauses.
  for (const Unit& u : units) {
    Sequence& seq = *u.seq;
    if (seq.phase == Phase::Decoding && !seq.drafts.empty() &&
        !reserve_free(seq, seq.cached + u.count + static_cast<int32_t>(seq.drafts.size())))
      seq.drafts.clear();  // no room for the proposals: a plain decode step
  }
  for (Sequence* seq : resident())
    if (seq->phase != Phase::Decoding) seq->drafts.clear();  // paused or not decoding: no round

  auto add_slice = [&](Sequence& seq, const int32_t* tokens, int32_t count, bool wants_logits) {
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
  for (const Unit& u : units) {
    Sequence& seq = *u.seq;
    if (seq.phase != Phase::Decoding) continue;
    add_slice(seq, &seq.output.back(), 1, true);
    if (!seq.drafts.empty()) {  // a speculative round: verify every proposal in this traversal
      SeqSlice& slice = step.batch.slices.back();
      const auto count = static_cast<int32_t>(seq.drafts.size());
      slice.num_tokens += count;
      slice.all_logits = true;
      slice.keep_states = true;
      step.tokens.insert(step.tokens.end(), seq.drafts.begin(), seq.drafts.end());
    }
    ++step.decode_rows;
  }
  for (const Unit& u : units) {
    Sequence& seq = *u.seq;
    if (seq.phase != Phase::Prefilling) continue;
    const bool completes = u.count == seq.prefill_left();
    // A replay ends on the last committed token's predecessor: nothing is sampled there.
    add_slice(seq, seq.history.data() + seq.cached, u.count, completes && !seq.replaying() && seq.output_cap > 0);
    step.prefill_tokens += u.count;
  }
  step.batch.tokens = step.tokens;
}

bool Scheduler::reserve_free(Sequence& seq, int32_t tokens) {
  const int64_t needed = (tokens + kPageTokens - 1) / kPageTokens;
  const int64_t missing = needed - static_cast<int64_t>(seq.pages.size());
  if (missing <= 0) return true;
  if (pool_.free_pages() < missing) return false;
  auto pages = pool_.allocate(missing);
  seq.pages.insert(seq.pages.end(), pages->begin(), pages->end());
  return true;
}

void Scheduler::truncate(Sequence& seq, int32_t tokens) {
  const auto keep = static_cast<size_t>(std::max<int64_t>((tokens + kPageTokens - 1) / kPageTokens, seq.chain.blocks));
  if (seq.pages.size() <= keep) return;
  std::vector<int32_t> extra(seq.pages.begin() + static_cast<ptrdiff_t>(keep), seq.pages.end());
  seq.pages.resize(keep);
  pool_.release(extra);
}

void Scheduler::release(Sequence& seq) {
  drop_pages(seq);
  const int lane = seq.lane;
  seq.lane = -1;
  if (lane >= 0 && lanes_[static_cast<size_t>(lane)].get() == &seq) {
    // The lane may hold the last reference: `seq` must not be touched after this.
    lanes_[static_cast<size_t>(lane)].reset();
    --running_;
  }
}

}  // namespace ninfer
