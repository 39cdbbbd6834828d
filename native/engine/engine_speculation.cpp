// Speculative rounds (docs/engine.md): choosing proposals, committing a verified row, and the
// MTP head's drafting after each step.
//
// A decoding row at `cached = n` feeds its last token t plus proposals d1..dk at positions
// n..n+k with logits for every position. Row i is sampled exactly as plain decoding would
// sample the token after t, d1..di (penalties and min_tokens see the proposals as committed,
// and it uses the request's next uniform draw), and tokens are committed in order while each
// equals the proposal that follows it: the accepted prefix plus one correction or bonus token.
// Greedy output therefore equals plain greedy output, and sampled output keeps the target
// distribution (a proposal q that is one-hot at d is accepted with probability p(d), and a
// rejection resamples from p without d: sample-and-compare does both). The model then keeps
// the state of the accepted prefix (Model::keep_prefix).
#include <algorithm>
#include <span>
#include <stdexcept>
#include <string>

#include "engine/engine.h"
#include "models/qwen3_5.h"

namespace ninfer {

std::string speculative_options_problem(const SpeculativeOptions& spec) {
  if (spec.mtp_draft_tokens < 0 || spec.mtp_draft_tokens > 5)
    return "MTP draft tokens must be between 1 and 5, got " + std::to_string(spec.mtp_draft_tokens);
  if (spec.ngram_draft_tokens < 0 || spec.ngram_draft_tokens > 63)
    return "n-gram draft tokens must be between 0 and 63, got " + std::to_string(spec.ngram_draft_tokens);
  if (spec.ngram_min_match < 4 || spec.ngram_min_match > 64)
    return "n-gram min match must be between 4 and 64, got " + std::to_string(spec.ngram_min_match);
  if (spec.lm_head_draft_tokens < 0)
    return "the proposal head size must not be negative, got " + std::to_string(spec.lm_head_draft_tokens);
  if (spec.max_batch < -1)
    return "the speculative batch limit must be -1 (auto), 0 (none) or positive, got " + std::to_string(spec.max_batch);
  if (spec.lm_head_draft_tokens > 0 && spec.mtp_draft_tokens == 0)
    return "a proposal head (lm_head_draft_tokens) drafts for the MTP head: it needs mtp_draft_tokens";
  return {};
}

double Engine::peek_draw(Sequence& seq, size_t index) const {
  while (seq.draws.size() <= index) seq.draws.push_back(seq.sampler.next_draw());
  return seq.draws[index];
}

namespace {

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

}  // namespace

namespace {

// A constraint that starts after a token (the end of thinking) must not start inside a
// round: the device path computes every row's mask before sampling, and the matcher cannot
// undo its activation. Proposals end before that token; it is then sampled as the round's
// last token, and the next round is constrained from its first row.
void keep_constraint_start_out(Sequence& seq) {
  if (!seq.constraint || seq.constraint->active()) return;
  const int32_t start = seq.params.constraint->start_after;
  auto at = std::find(seq.drafts.begin(), seq.drafts.end(), start);
  seq.drafts.erase(at, seq.drafts.end());
}

}  // namespace

bool Engine::drafting_paused(int32_t decode_rows) const {
  return options_.spec.max_batch > 0 && decode_rows > options_.spec.max_batch;
}

void Engine::choose_drafts() {
  const SpeculativeOptions& spec = options_.spec;
  int32_t decoding = 0;
  for (const Sequence* seq : scheduler_.resident())
    if (seq->phase == Phase::Decoding && !seq->cancel_requested) ++decoding;
  // Above the batch limit every row decodes plainly (a fallback step), until the batch shrinks.
  const bool paused = drafting_paused(decoding);
  for (Sequence* seq : scheduler_.resident()) {
    seq->drafts.clear();
    seq->drafts_from_ngram = false;
    if (paused || seq->phase != Phase::Decoding || seq->cancel_requested) continue;
    // The round commits at most drafts + 1 tokens, so the output cap bounds the proposals
    // (and with it every position a round writes stays under max_context).
    const int32_t room = seq->output_cap - static_cast<int32_t>(seq->output.size()) - 1;
    if (room <= 0 || seq->thinking.forcing_next()) continue;
    if (const auto& oracle = seq->params.draft_oracle; !oracle.empty()) {
      const size_t from = std::min(seq->output.size(), oracle.size());
      const size_t count = std::min({static_cast<size_t>(room), static_cast<size_t>(spec.max_drafts()), oracle.size() - from});
      seq->drafts.assign(oracle.begin() + static_cast<ptrdiff_t>(from), oracle.begin() + static_cast<ptrdiff_t>(from + count));
      keep_constraint_start_out(*seq);
      continue;
    }
    std::vector<int32_t> ngram;
    if (spec.ngram_draft_tokens > 0) {
      if (!seq->ngram) seq->ngram = std::make_unique<NgramDrafter>(spec.ngram_min_match);
      seq->ngram->sync(seq->params.prompt, seq->output);
      ngram = seq->ngram->propose(std::min(room, spec.ngram_draft_tokens));
    }
    const std::vector<int32_t>& mtp = seq->mtp_drafts;
    // A copy wins when the head has nothing or agrees with its first token; else the head.
    if (!ngram.empty() && (mtp.empty() || mtp.front() == ngram.front())) {
      seq->drafts = std::move(ngram);
      seq->drafts_from_ngram = true;
    } else {
      seq->drafts.assign(mtp.begin(), mtp.begin() + std::min<ptrdiff_t>(room, static_cast<ptrdiff_t>(mtp.size())));
    }
    keep_constraint_start_out(*seq);
  }
}

void Engine::commit_row(Sequence& seq, const SeqSlice& slice, int logit_row, EngineEvent& event,
                        bool sampled_on_device) {
  const bool spec = speculating();
  const bool draws = seq.params.sampling.temperature > 0.0f;
  const int rows = slice.logit_rows();
  const size_t proposals = slice.all_logits ? seq.drafts.size() : 0;
  int accepted = 0;
  try {
    for (int i = 0; i < rows; ++i) {
      int32_t token = 0;
      bool drew = false;
      if (auto forced = seq.thinking.next_forced()) {
        token = *forced;  // the thinking budget closes thinking: committed without sampling
      } else if (sampled_on_device) {
        const auto at = static_cast<size_t>(logit_row + i);
        token = sampled_ids_[at];
        if (token < 0 && dead_ends_[at]) {
          finish(seq, event, FinishReason::Error);
          event.error = kDeadEndError;
          break;
        }
        if (token < 0) throw std::runtime_error(sampled_code_error(token));
        if (token >= vocab_size_)
          throw std::runtime_error("the device sampler chose id " + std::to_string(token) + ", outside the vocabulary");
        drew = spec && draws;
      } else {
        float* logits = logits_.data() + static_cast<int64_t>(logit_row + i) * vocab_size_;
        const std::span<float> row(logits, static_cast<size_t>(vocab_size_));
        if (seq.params.capture_logits) event.logits.insert(event.logits.end(), row.begin(), row.end());
        // Rows are committed in order, so the matcher is already at this row's position: the
        // proposals before it were accepted and equal the committed tokens.
        if (seq.constrained_now() && !mask_constrained_row(seq, row)) {
          if (seq.params.capture_logits) event.logits.resize(event.logits.size() - static_cast<size_t>(vocab_size_));
          finish(seq, event, FinishReason::Error);
          event.error = kDeadEndError;
          break;
        }
        if (spec) {
          token = seq.sampler.sample_with_draw(row, seq.output_counts, suppressed_ids(seq), draws ? peek_draw(seq, 0) : 0.0);
          drew = draws;
        } else {
          token = seq.sampler.sample(row, seq.output_counts, suppressed_ids(seq));
        }
      }
      if (drew) seq.draws.pop_front();
      if (seq.constraint && !seq.constraint->accept(token))
        throw std::runtime_error("the grammar rejected sampled token " + std::to_string(token));
      tokens_decoded_.fetch_add(1, std::memory_order_relaxed);
      if (!seq.output.empty()) decode_tokens_.fetch_add(1, std::memory_order_relaxed);
      commit_token(seq, token, event);
      ++seq.round_committed;
      if (event.finished || static_cast<size_t>(i) >= proposals) break;
      if (token != seq.drafts[static_cast<size_t>(i)]) break;  // rejected: row i's token corrects it
      ++accepted;
      // A thinking cap reached inside the round: the close sequence is forced next round.
      if (seq.thinking.forcing_next()) break;
    }
  } catch (const std::exception& e) {
    finish(seq, event, FinishReason::Error);
    event.error = std::string("sampling failed: ") + e.what();
  }
  if (proposals == 0) {
    if (spec && slice.start_pos >= seq.prompt_len()) {
      spec_fallback_steps_.fetch_add(1, std::memory_order_relaxed);
      ++seq.spec_tally.fallback_steps;
      if (event.finished) event.speculative = seq.spec_tally;
    }
    return;
  }
  seq.draft_n += static_cast<int32_t>(proposals);
  seq.draft_n_accepted += accepted;
  event.timings.draft_n = seq.draft_n;
  event.timings.draft_n_accepted = seq.draft_n_accepted;
  SpeculativeTally& tally = seq.spec_tally;
  ++tally.rounds;
  tally.drafted += static_cast<int32_t>(proposals);
  tally.accepted += accepted;
  if (seq.drafts_from_ngram) {
    ++tally.ngram_rounds;
    tally.ngram_drafted += static_cast<int32_t>(proposals);
    tally.ngram_accepted += accepted;
  }
  if (tally.accepted_per_position.size() < proposals) tally.accepted_per_position.resize(proposals, 0);
  for (int i = 0; i < accepted; ++i) ++tally.accepted_per_position[static_cast<size_t>(i)];
  if (event.finished) event.speculative = tally;  // finish() ran before this round was counted
  spec_rounds_.fetch_add(1, std::memory_order_relaxed);
  spec_draft_tokens_.fetch_add(proposals, std::memory_order_relaxed);
  spec_accepted_tokens_.fetch_add(static_cast<uint64_t>(accepted), std::memory_order_relaxed);
  if (seq.drafts_from_ngram) {
    spec_ngram_rounds_.fetch_add(1, std::memory_order_relaxed);
    spec_ngram_draft_tokens_.fetch_add(proposals, std::memory_order_relaxed);
    spec_ngram_accepted_tokens_.fetch_add(static_cast<uint64_t>(accepted), std::memory_order_relaxed);
  }
}

// The round fed positions start..start+k and kept start..end-1 (end = start + committed; the
// token committed last is fed by the next step). KV past `end` is rewritten before anything
// reads it, so its pages go back to the pool; the recurrent state is the one after end - 1.
// The prefix cache publishes from `history`, which holds committed tokens only, so no block
// or snapshot ever contains a rejected proposal. A block boundary crossed inside the round
// gets its decode-endpoint snapshot from the per-token state history first, as a plain
// decode step would have taken it there.
void Engine::settle_round(Sequence& seq, const SeqSlice& slice) {
  const int32_t end = slice.start_pos + seq.round_committed;
  const int32_t boundary = end / kPageTokens * kPageTokens;
  if (cache_ && cache_->needs_snapshots() && boundary > slice.start_pos && boundary < end) {
    model_->keep_prefix(seq.lane, boundary);
    seq.cached = boundary;
    cache_step(seq);
  }
  seq.cached = end;
  model_->keep_prefix(seq.lane, end);
  cache_step(seq);
  scheduler_.truncate(seq, end + 1);
}

// MTP slot i pairs the target's hidden at position i with the token at i + 1 and predicts the
// token at i + 2 (model spec §4.2). After each step the head reads every position the step
// fed (prefill chunks included, so its KV covers the whole sequence), then drafts: step 1's
// last row gives d1 at the request's frontier, and steps 2..k feed the head's own hidden and
// previous draft one position further. Its KV is positional: entries written by drafts that
// are later rejected sit past the frontier and are rewritten before anything reads them.
void Engine::draft_with_mtp(const std::vector<Sequence*>& done) {
  const int64_t h = model_->info().hidden_size;
  struct Lane {
    Sequence* seq;
    int32_t drafts;  // proposals wanted for its next round
  };
  std::vector<Lane> lanes;
  std::vector<int32_t> tokens, last_rows;
  std::vector<float> hidden_prev;
  BatchPlan plan;
  int32_t row = 0;
  for (size_t i = 0; i < step_.rows.size(); ++i) {
    Sequence& seq = *step_.rows[i];
    const SeqSlice& slice = step_.batch.slices[i];
    const int32_t begin = row;
    row += slice.num_tokens;
    seq.mtp_drafts.clear();
    if (seq.mtp_failed || seq.phase == Phase::Finished ||
        std::find(done.begin(), done.end(), &seq) != done.end())
      continue;
    // Pairs (h_p, x_{p+1}) for the positions this step fed and kept, whose next token is known.
    int32_t pairs = 0;
    if (static_cast<int32_t>(i) >= step_.decode_rows) {
      // A prefill chunk (prompt, or a replay of prompt and output after a pause); the last
      // position's next token is the first output, or unknown yet.
      for (int32_t p = 0; p < slice.num_tokens; ++p) {
        const auto next = static_cast<size_t>(slice.start_pos + p + 1);
        if (next >= seq.history.size()) break;
        tokens.push_back(seq.history[next]);
        ++pairs;
      }
    } else {  // a decode row: the kept positions, each followed by a token the round committed
      pairs = seq.round_committed;
      tokens.insert(tokens.end(), seq.output.end() - pairs, seq.output.end());
    }
    if (pairs <= 0) continue;
    SeqSlice s;
    s.lane = seq.lane;
    s.start_pos = slice.start_pos;
    s.num_tokens = pairs;
    s.page_table = seq.pages.data();
    s.num_pages = static_cast<int32_t>(seq.pages.size());
    plan.slices.push_back(s);
    hidden_prev.insert(hidden_prev.end(), hidden_.begin() + static_cast<ptrdiff_t>(begin) * h,
                       hidden_.begin() + static_cast<ptrdiff_t>(begin + pairs) * h);
    last_rows.push_back(static_cast<int32_t>(tokens.size()) - 1);
    const int32_t room = seq.output_cap - static_cast<int32_t>(seq.output.size()) - 1;
    // Above the batch limit the head still passes over the kept positions (its KV layer stays
    // complete for when drafting resumes) but drafts nothing.
    const bool wanted = seq.phase == Phase::Decoding && !drafting_paused(step_.decode_rows);
    lanes.push_back({&seq, wanted ? std::max(0, std::min(room, options_.spec.mtp_draft_tokens)) : 0});
  }
  if (plan.slices.empty()) return;
  plan.tokens = tokens;
  // A constrained request's next masks wait on these drafts: its batch's head traversals are
  // the draft-ready wait (ninfer_constraint_draft_wait_seconds_total), counted once per batch.
  bool constrained = false;
  for (const Lane& lane : lanes) constrained = constrained || (lane.seq->constraint && lane.drafts > 0);
  const auto draft_wait = [&] {
    const uint64_t ns = worker_time_.lap_device_wait();
    if (constrained) constraint_draft_wait_ns_.fetch_add(ns, std::memory_order_relaxed);
  };
  const int64_t vocab = mtp_->proposal_vocab();  // the columns the head scores (--lm-head-draft)
  try {
    mtp_logits_.resize(last_rows.size() * static_cast<size_t>(vocab));
    mtp_hidden_.resize(last_rows.size() * static_cast<size_t>(h));
    worker_time_.lap(HostPhase::ProgramPost);  // the head's traversals are device wait
    mtp_->forward_mtp_rows(plan, hidden_prev.data(), 0, last_rows, mtp_logits_.data(), mtp_hidden_.data());
    draft_wait();
    // Later steps: one token per lane that still wants drafts.
    for (int step = 1;; ++step) {
      std::vector<size_t> active;
      for (size_t l = 0; l < lanes.size(); ++l) {
        Lane& lane = lanes[l];
        if (static_cast<int32_t>(lane.seq->mtp_drafts.size()) >= lane.drafts) continue;
        lane.seq->mtp_drafts.push_back(mtp_->proposal_token(argmax(mtp_logits_.data() + l * vocab, vocab)));
        if (static_cast<int32_t>(lane.seq->mtp_drafts.size()) < lane.drafts) active.push_back(l);
      }
      if (active.empty()) break;
      BatchPlan next;
      std::vector<int32_t> next_tokens, next_rows;
      std::vector<float> next_hidden;
      {
        // Pool bookkeeping: pages for the positions drafted ahead, from free pages only (a
        // lane without room proposes what it has).
        std::lock_guard lock(mu_);
        std::erase_if(active, [&](size_t l) {
          Sequence& seq = *lanes[l].seq;
          if (scheduler_.reserve_free(seq, seq.cached + step)) return false;
          lanes[l].drafts = static_cast<int32_t>(seq.mtp_drafts.size());
          return true;
        });
      }
      if (active.empty()) break;
      for (size_t l : active) {
        Sequence& seq = *lanes[l].seq;
        SeqSlice s;
        s.lane = seq.lane;
        s.start_pos = seq.cached + step - 1;
        s.num_tokens = 1;
        s.page_table = seq.pages.data();
        s.num_pages = static_cast<int32_t>(seq.pages.size());
        next.slices.push_back(s);
        next_tokens.push_back(seq.mtp_drafts.back());
        next_rows.push_back(static_cast<int32_t>(next_rows.size()));
        next_hidden.insert(next_hidden.end(), mtp_hidden_.begin() + static_cast<ptrdiff_t>(l) * h,
                           mtp_hidden_.begin() + static_cast<ptrdiff_t>(l + 1) * h);
      }
      next.tokens = next_tokens;
      std::vector<float> logits(active.size() * static_cast<size_t>(vocab)), hidden(active.size() * static_cast<size_t>(h));
      worker_time_.lap(HostPhase::ProgramPost);
      mtp_->forward_mtp_rows(next, next_hidden.data(), step, next_rows, logits.data(), hidden.data());
      draft_wait();
      // Lanes not in `active` are complete; scatter the active ones back to their slots.
      for (size_t a = 0; a < active.size(); ++a) {
        std::copy_n(logits.begin() + static_cast<ptrdiff_t>(a) * vocab, vocab,
                    mtp_logits_.begin() + static_cast<ptrdiff_t>(active[a]) * vocab);
        std::copy_n(hidden.begin() + static_cast<ptrdiff_t>(a) * h, h,
                    mtp_hidden_.begin() + static_cast<ptrdiff_t>(active[a]) * h);
      }
    }
  } catch (const std::exception&) {
    // Proposals only speed decoding up: a failed head leaves these requests exact, undrafted.
    for (Lane& lane : lanes) {
      lane.seq->mtp_failed = true;
      lane.seq->mtp_drafts.clear();
    }
  }
}

}  // namespace ninfer
