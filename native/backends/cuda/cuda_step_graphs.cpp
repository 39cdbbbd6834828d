// Decode steps as captured CUDA graphs: one graph per step signature (batch size, staged
// metadata sizes, split counts, matmul paths), replayed after this step's metadata is copied
// into the graph's pinned staging buffers. See CudaBackend::run_step in cuda_backend.h.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"

namespace ninfer::cuda {

namespace {

// Distinct signatures kept (the cache is dropped beyond): decode steps per batch size, and with
// speculation verification rounds per batch size and width plus the MTP head's draft steps.
constexpr size_t kMaxGraphs = 160;
constexpr size_t kMaxSeen = 4096;     // signatures remembered for the warm-up rule
// Dry ops launch nothing; the pointers they get back are never dereferenced.
const void* const kDryPointer = reinterpret_cast<const void*>(uintptr_t(256));
std::atomic<uint64_t> replays{0};

}  // namespace

uint64_t graph_replays_total() { return replays.load(); }

bool step_graphs_from_env() {
  const char* v = std::getenv("NINFER_CUDA_GRAPHS");
  return !(v && std::strcmp(v, "0") == 0);
}

bool overlap_launches_from_env() {
  const char* v = std::getenv("NINFER_CUDA_PDL");
  return !(v && std::strcmp(v, "0") == 0);
}

CudaBackend::StepGraph::~StepGraph() {
  if (done) cudaEventSynchronize(done);
  if (exec) cudaGraphExecDestroy(exec);
  if (done) cudaEventDestroy(done);
  for (void* p : host) cudaFreeHost(p);
  for (void* p : device) cudaFree(p);
}

const void* CudaBackend::stage(MetadataSlot& slot, const void* data, size_t bytes) {
  if (mode_ == StepMode::Eager) return slot.upload(data, bytes, stream_);
  if (mode_ == StepMode::Dry) {
    // Repeats of a slot's latest upload in this step (every layer's positions, KV slots, ...)
    // share it, as MetadataSlot does eagerly.
    auto it = slot_last_.find(&slot);
    const auto* p = static_cast<const unsigned char*>(data);
    if (it != slot_last_.end()) {
      const auto& last = staged_[it->second];
      if (last.size() == bytes && (bytes == 0 || std::memcmp(last.data(), p, bytes) == 0)) {
        stage_choice_.push_back(static_cast<int64_t>(it->second));
        signature_.push_back(-1 - static_cast<int64_t>(it->second));
        return kDryPointer;
      }
    }
    staged_.emplace_back(p, p + bytes);
    slot_last_[&slot] = staged_.size() - 1;
    stage_choice_.push_back(static_cast<int64_t>(staged_.size() - 1));
    signature_.push_back(static_cast<int64_t>(bytes));
    return kDryPointer;
  }
  // Capture: the same calls in the same order as the dry run that made this graph.
  if (stage_cursor_ >= stage_choice_.size()) throw std::logic_error("step capture: more uploads than the dry run");
  const auto index = static_cast<size_t>(stage_choice_[stage_cursor_++]);
  if (capturing_->bytes[index] != bytes) throw std::logic_error("step capture: an upload changed size");
  return capturing_->device[index];
}

void CudaBackend::run_step(bool graphable, const std::function<void()>& enqueue, int64_t variant) {
  overlap_launches_ = overlap_launches_from_env();
  if (!step_graphs_ || !graphable || !step_graphs_from_env()) {
    enqueue();
    return;
  }
  activate();
  signature_.assign(1, variant);
  staged_.clear();
  stage_choice_.clear();
  slot_last_.clear();
  step_graphable_ = true;
  mode_ = StepMode::Dry;
  try {
    enqueue();
  } catch (...) {
    mode_ = StepMode::Eager;
    throw;
  }
  mode_ = StepMode::Eager;
  if (!step_graphable_ || uncapturable_.count(signature_)) {
    enqueue();
    return;
  }
  if (graphs_generation_ != scratch_generation()) {  // a scratch buffer moved: every graph is stale
    graphs_.clear();
    graphs_generation_ = scratch_generation();
  }
  if (auto it = graphs_.find(signature_); it != graphs_.end()) {
    launch_graph(*it->second);
    return;
  }
  if (seen_.size() >= kMaxSeen) seen_.clear();
  if (seen_.insert(signature_).second) {  // first sight: run eagerly so scratch reaches its size
    enqueue();
    return;
  }
  capture_and_launch(enqueue);
}

void CudaBackend::capture_and_launch(const std::function<void()>& enqueue) {
  if (graphs_.size() >= kMaxGraphs) graphs_.clear();
  auto graph = std::make_unique<StepGraph>();
  for (const auto& data : staged_) {
    void* host = nullptr;
    void* device = nullptr;
    NINFER_CUDA_CHECK(cudaHostAlloc(&host, std::max<size_t>(data.size(), 1), cudaHostAllocDefault));
    graph->host.push_back(host);
    NINFER_CUDA_CHECK(cudaMalloc(&device, std::max<size_t>(data.size(), 1)));
    graph->device.push_back(device);
    graph->bytes.push_back(data.size());
  }
  NINFER_CUDA_CHECK(cudaEventCreateWithFlags(&graph->done, cudaEventDisableTiming));
  NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  NINFER_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  // The graph begins with every metadata copy; the kernels read the device copies.
  for (size_t i = 0; i < staged_.size(); ++i)
    if (graph->bytes[i])
      NINFER_CUDA_CHECK(
          cudaMemcpyAsync(graph->device[i], graph->host[i], graph->bytes[i], cudaMemcpyHostToDevice, stream_));
  mode_ = StepMode::Capture;
  capturing_ = graph.get();
  stage_cursor_ = 0;
  cudaGraph_t captured = nullptr;
  bool ok = true;
  try {
    enqueue();
    ok = stage_cursor_ == stage_choice_.size();
  } catch (const std::exception&) {
    ok = false;
  }
  mode_ = StepMode::Eager;
  capturing_ = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &captured);
  cudaGraphExec_t exec = nullptr;
  if (ok && end == cudaSuccess && captured) ok = cudaGraphInstantiate(&exec, captured, 0) == cudaSuccess;
  else ok = false;
  if (captured) cudaGraphDestroy(captured);
  if (!ok) {
    // Something in the step cannot be captured: remember it and run this shape eagerly.
    (void)cudaGetLastError();
    uncapturable_.insert(signature_);
    enqueue();
    return;
  }
  graph->exec = exec;
  StepGraph& g = *graph;
  graphs_[signature_] = std::move(graph);
  launch_graph(g);
}

void CudaBackend::launch_graph(StepGraph& graph) {
  NINFER_CUDA_CHECK(cudaEventSynchronize(graph.done));  // the previous replay has read the staging
  for (size_t i = 0; i < staged_.size(); ++i)
    if (graph.bytes[i]) std::memcpy(graph.host[i], staged_[i].data(), graph.bytes[i]);
  NINFER_CUDA_CHECK(cudaGraphLaunch(graph.exec, stream_));
  NINFER_CUDA_CHECK(cudaEventRecord(graph.done, stream_));
  ++replays;
}

}  // namespace ninfer::cuda
