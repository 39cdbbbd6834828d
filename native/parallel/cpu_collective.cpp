// The CPU collective group: ranks are threads; each publishes a pointer to its buffer, and
// after a barrier every rank reads the others' buffers directly (shared memory, no copies
// through a channel).
#include <barrier>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/collective.h"

namespace ninfer {

namespace {

struct SharedGroup {
  explicit SharedGroup(int size) : arrive(size), inputs(static_cast<size_t>(size)) {}
  std::barrier<> arrive;
  std::vector<const float*> inputs;  // each rank's buffer during the current collective
};

class CpuCollective final : public Collective {
 public:
  CpuCollective(std::shared_ptr<SharedGroup> group, int rank, int size)
      : group_(std::move(group)), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* x, int64_t n) override {
    if (size_ == 1 || n == 0) return;
    publish(x);
    // Each rank sums every rank's buffer in rank order into private scratch, so all ranks
    // hold identical sums; nobody overwrites a published buffer until all have read it.
    scratch_.assign(group_->inputs[0], group_->inputs[0] + n);
    for (int r = 1; r < size_; ++r) {
      const float* src = group_->inputs[static_cast<size_t>(r)];
      for (int64_t i = 0; i < n; ++i) scratch_[static_cast<size_t>(i)] += src[i];
    }
    group_->arrive.arrive_and_wait();
    std::memcpy(x, scratch_.data(), static_cast<size_t>(n) * sizeof(float));
  }

  void all_gather(const float* x, int64_t n, float* out) override {
    if (n == 0) return;
    publish(x);
    for (int r = 0; r < size_; ++r)
      std::memcpy(out + static_cast<int64_t>(r) * n, group_->inputs[static_cast<size_t>(r)],
                  static_cast<size_t>(n) * sizeof(float));
    group_->arrive.arrive_and_wait();  // the inputs stay published until every rank copied
  }

 private:
  void publish(const float* x) {
    group_->inputs[static_cast<size_t>(rank_)] = x;
    group_->arrive.arrive_and_wait();
  }

  std::shared_ptr<SharedGroup> group_;
  int rank_, size_;
  std::vector<float> scratch_;
};

}  // namespace

std::vector<std::unique_ptr<Collective>> make_cpu_collective_group(int size) {
  if (size < 1) throw std::invalid_argument("a collective group needs at least one rank, got " + std::to_string(size));
  auto group = std::make_shared<SharedGroup>(size);
  std::vector<std::unique_ptr<Collective>> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(std::make_unique<CpuCollective>(group, r, size));
  return ranks;
}

}  // namespace ninfer
