// The CUDA hybrid-model kernels (GDN, gated attention pieces, MoE routing) on numpy arrays, for
// the GPU tests, plus device-timed runs of the GDN core at real shapes for the benchmark.
//
// Every array argument is copied to the device, outputs too (so a test that poisons an output
// sees which elements a kernel wrote), and the arrays marked in/out are copied back.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/bindings.h"

#ifdef NINFER_WITH_CUDA
#include <cuda_runtime.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/launchers.h"
#include "backends/cuda/launchers_hybrid.h"
#endif

namespace py = pybind11;

namespace ninfer::bindings {

#ifdef NINFER_WITH_CUDA
namespace {

using cuda::GdnSeq;
using cuda::GdnDims;

// A device copy of a C-contiguous numpy array of T; download() writes it back.
template <typename T>
class DeviceArray {
 public:
  DeviceArray(py::array array, const char* what, cudaStream_t stream) : array_(std::move(array)), stream_(stream) {
    if (!array_.dtype().is(py::dtype::of<T>()))
      throw py::type_error(std::string(what) + ": expected dtype " + std::string(py::str(py::dtype::of<T>())));
    if (!(array_.flags() & py::array::c_style)) throw py::value_error(std::string(what) + ": must be C-contiguous");
    NINFER_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(array_.nbytes(), 4)));
    NINFER_CUDA_CHECK(cudaMemcpyAsync(ptr_, array_.data(), array_.nbytes(), cudaMemcpyHostToDevice, stream_));
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    cudaStreamSynchronize(stream_);
    cudaFree(ptr_);
  }
  T* get() const { return static_cast<T*>(ptr_); }
  void download() {
    if (!array_.writeable()) throw py::value_error("output array must be writable");
    NINFER_CUDA_CHECK(cudaMemcpyAsync(array_.mutable_data(), ptr_, array_.nbytes(), cudaMemcpyDeviceToHost, stream_));
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  py::array array_;
  cudaStream_t stream_;
  void* ptr_ = nullptr;
};
using F32 = DeviceArray<float>;
using I32 = DeviceArray<int32_t>;

// Device-only scratch for the timed runs.
class Scratch {
 public:
  explicit Scratch(size_t bytes) { NINFER_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(bytes, 4))); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { cudaFree(ptr_); }
  float* f() const { return static_cast<float*>(ptr_); }
  const GdnSeq* seqs() const { return static_cast<const GdnSeq*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

using SeqList = std::vector<std::tuple<int, int, int>>;  // (row_begin, num_tokens, state_slot)

class CudaHybridOps {
 public:
  explicit CudaHybridOps(int device) : device_(device) {
    NINFER_CUDA_CHECK(cudaSetDevice(device));
    NINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~CudaHybridOps() {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  // history (optional): [rows, K-1, C], the conv state after each row of each sequence.
  void causal_conv1d_silu(py::array x, py::array weight, const SeqList& seqs, py::array conv_states, py::array out,
                          std::optional<py::array> history) {
    if (x.ndim() != 2 || weight.ndim() != 2 || out.ndim() != 2) throw py::value_error("x, out [rows, C]; weight [C, K]");
    const int64_t channels = x.shape(1);
    F32 xd(x, "x", stream_), wd(weight, "weight", stream_), sd(conv_states, "conv_states", stream_),
        od(out, "out", stream_);
    const int64_t kernel = weight.shape(1);
    std::unique_ptr<F32> hd;
    if (history) hd = std::make_unique<F32>(*history, "history", stream_);
    auto [sq, max_tokens] = upload_seqs(seqs, sd.get(), (kernel - 1) * channels, nullptr, 0,
                                        hd ? hd->get() : nullptr, (kernel - 1) * channels);
    cuda::launch_causal_conv1d_silu(xd.get(), channels, channels, wd.get(), static_cast<int>(kernel), sq->seqs(),
                                    static_cast<int>(seqs.size()), max_tokens, od.get(), channels, stream_);
    od.download();
    sd.download();
    if (hd) hd->download();
  }

  void l2norm_heads(py::array x, float scale, float eps) {
    if (x.ndim() != 3) throw py::value_error("x must be [tokens, heads, head_dim]");
    F32 xd(x, "x", stream_);
    cuda::launch_l2norm_heads(xd.get(), x.shape(1) * x.shape(2), x.shape(0), x.shape(1), x.shape(2), scale, eps,
                              stream_);
    xd.download();
  }

  void gdn_gates(py::array b, py::array a, py::array A_log, py::array dt_bias, py::array beta, py::array g) {
    const int64_t tokens = b.shape(0), heads = b.shape(1);
    F32 bd(b, "b", stream_), ad(a, "a", stream_), Ad(A_log, "A_log", stream_), dd(dt_bias, "dt_bias", stream_),
        betad(beta, "beta", stream_), gd(g, "g", stream_);
    cuda::launch_gdn_gates(bd.get(), heads, ad.get(), heads, tokens, heads, Ad.get(), dd.get(), betad.get(), gd.get(),
                           stream_);
    betad.download();
    gd.download();
  }

  // q, k [rows, Hk, dk]; v, out [rows, Hv, dv]; g, beta [rows, Hv]; states [slots, Hv, dk, dv];
  // history (optional): [rows, Hv, dk, dv], the state after each row of each sequence.
  void gated_delta_rule(py::array q, py::array k, py::array v, py::array g, py::array beta, const SeqList& seqs,
                        py::array states, py::array out, std::optional<py::array> history, bool chunked) {
    if (q.ndim() != 3 || v.ndim() != 3 || states.ndim() != 4) throw py::value_error("bad ranks");
    if (chunked && history) throw py::value_error("the chunked form keeps no per-token history");
    const GdnDims shape{static_cast<int32_t>(q.shape(1)), static_cast<int32_t>(v.shape(1)),
                         static_cast<int32_t>(q.shape(2)), static_cast<int32_t>(v.shape(2))};
    F32 qd(q, "q", stream_), kd(k, "k", stream_), vd(v, "v", stream_), gd(g, "g", stream_), bd(beta, "beta", stream_),
        sd(states, "states", stream_), od(out, "out", stream_);
    std::unique_ptr<F32> hd;
    if (history) hd = std::make_unique<F32>(*history, "history", stream_);
    const int64_t state_floats = states.size() / states.shape(0);
    auto [sq, max_tokens] =
        upload_seqs(seqs, nullptr, 0, sd.get(), state_floats, hd ? hd->get() : nullptr, state_floats, true);
    (void)max_tokens;
    cuda::DeltaRuleArgs args{qd.get(), kd.get(), q.shape(1) * q.shape(2), vd.get(), v.shape(1) * v.shape(2),
                             gd.get(), bd.get(), od.get(), v.shape(1) * v.shape(2)};
    if (chunked) {
      int64_t chunks = 0;
      for (const auto& [begin, count, slot] : seqs) chunks += cuda::gdn_chunk_count(count);
      Scratch workspace(cuda::gdn_chunked_workspace_floats(shape, chunks) * sizeof(float));
      cuda::launch_gated_delta_rule_chunked(shape, args, sq->seqs(), static_cast<int>(seqs.size()),
                                            static_cast<int>(chunks), workspace.f(), stream_);
      NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the workspace dies here
    } else
      cuda::launch_gated_delta_rule_recurrent(shape, args, sq->seqs(), static_cast<int>(seqs.size()), stream_);
    od.download();
    sd.download();
    if (hd) hd->download();
  }

  // The decode form (launch_gated_delta_rule_recurrent_prepared): q, k raw [rows, Hk, dk] (the
  // kernel L2-normalises them, q times 1/sqrt(dk)); a, b [rows, Hv] the raw gate projections;
  // A_log, dt_bias [Hv]. overlap: launched with programmatic dependent launch.
  void gated_delta_rule_prepared(py::array q, py::array k, py::array v, py::array a, py::array b, py::array A_log,
                                 py::array dt_bias, const SeqList& seqs, py::array states, py::array out,
                                 std::optional<py::array> history, bool overlap) {
    if (q.ndim() != 3 || v.ndim() != 3 || states.ndim() != 4 || a.ndim() != 2 || b.ndim() != 2)
      throw py::value_error("bad ranks");
    const GdnDims shape{static_cast<int32_t>(q.shape(1)), static_cast<int32_t>(v.shape(1)),
                        static_cast<int32_t>(q.shape(2)), static_cast<int32_t>(v.shape(2))};
    F32 qd(q, "q", stream_), kd(k, "k", stream_), vd(v, "v", stream_), ad(a, "a", stream_), bd(b, "b", stream_),
        Ad(A_log, "A_log", stream_), dd(dt_bias, "dt_bias", stream_), sd(states, "states", stream_),
        od(out, "out", stream_);
    std::unique_ptr<F32> hd;
    if (history) hd = std::make_unique<F32>(*history, "history", stream_);
    const int64_t state_floats = states.size() / states.shape(0);
    auto [sq, max_tokens] =
        upload_seqs(seqs, nullptr, 0, sd.get(), state_floats, hd ? hd->get() : nullptr, state_floats, true);
    (void)max_tokens;
    const cuda::DeltaRuleArgs args{qd.get(), kd.get(), q.shape(1) * q.shape(2), vd.get(), v.shape(1) * v.shape(2),
                                   nullptr, nullptr, od.get(), v.shape(1) * v.shape(2)};
    const cuda::GdnRawGates gates{bd.get(), b.shape(1), ad.get(), a.shape(1), Ad.get(), dd.get(),
                                  1.0f / std::sqrt(static_cast<float>(q.shape(2))), 1e-6f};
    cuda::launch_gated_delta_rule_recurrent_prepared(shape, args, gates, sq->seqs(), static_cast<int>(seqs.size()),
                                                     overlap, stream_);
    od.download();
    sd.download();
    if (hd) hd->download();
  }

  void gated_rmsnorm(py::array x, py::array z, py::array weight, float eps, py::array out) {
    F32 xd(x, "x", stream_), zd(z, "z", stream_), wd(weight, "weight", stream_), od(out, "out", stream_);
    cuda::launch_gated_rmsnorm(xd.get(), zd.get(), x.shape(0), x.shape(1), wd.get(), eps, od.get(), stream_);
    od.download();
  }

  void rmsnorm_zero_centered(py::array x, py::array weight, float eps, py::array out) {
    F32 xd(x, "x", stream_), wd(weight, "weight", stream_), od(out, "out", stream_);
    const int64_t dim = weight.shape(0), rows = x.size() / dim;
    cuda::launch_rmsnorm_zero_centered(xd.get(), dim, rows, dim, wd.get(), eps, od.get(), dim, stream_);
    od.download();
  }

  void split_query_gate(py::array in, py::array query, py::array gate) {
    if (in.ndim() != 3) throw py::value_error("input must be [tokens, heads, 2*head_dim]");
    F32 id(in, "in", stream_), qd(query, "query", stream_), gd(gate, "gate", stream_);
    cuda::launch_split_query_gate(id.get(), in.shape(0), in.shape(1), in.shape(2) / 2, qd.get(), gd.get(), stream_);
    qd.download();
    gd.download();
  }

  void sigmoid_gate_multiply(py::array x, py::array gate) {
    F32 xd(x, "x", stream_), gd(gate, "gate", stream_);
    cuda::launch_sigmoid_gate_multiply(xd.get(), gd.get(), x.size(), stream_);
    xd.download();
  }

  void moe_route(py::array logits, int64_t top_k, bool renormalize, py::array ids, py::array weights) {
    F32 ld(logits, "logits", stream_), wd(weights, "weights", stream_);
    I32 idd(ids, "ids", stream_);
    cuda::launch_moe_route_softmax_topk(ld.get(), logits.shape(0), logits.shape(1), top_k, renormalize, idd.get(),
                                        wd.get(), stream_);
    idd.download();
    wd.download();
  }

  void moe_combine(py::array rows, py::array row_of, py::array weights, py::array out) {
    F32 rd(rows, "rows", stream_), wd(weights, "weights", stream_), od(out, "out", stream_);
    I32 ro(row_of, "row_of", stream_);
    cuda::launch_moe_combine(rd.get(), out.shape(1), ro.get(), wd.get(), out.shape(0), row_of.shape(1), od.get(),
                             stream_);
    od.download();
  }

  void moe_add_gated_shared(py::array shared, py::array gate_logit, py::array out) {
    F32 sd(shared, "shared", stream_), gd(gate_logit, "gate_logit", stream_), od(out, "out", stream_);
    cuda::launch_moe_add_gated_shared(sd.get(), gd.get(), out.shape(0), out.shape(1), od.get(), stream_);
    od.download();
  }

  // Median device time (ms) of each stage of one GDN layer core for `lanes` sequences of
  // `tokens` tokens each, on seeded random data (states in [slots, Hv, dk, dv] fp32): conv,
  // q/k L2 norm, gates, delta rule (recurrent; chunked, and its prepare and scan kernels alone,
  // where supported), gated norm; "total" is the five back to back, the delta rule in the form
  // GdnForm::Auto picks.
  std::map<std::string, double> time_gdn_core(int lanes, int tokens, int key_heads, int value_heads, int key_dim,
                                              int value_dim, int reps) {
    const GdnDims shape{key_heads, value_heads, key_dim, value_dim};
    const int64_t rows = int64_t(lanes) * tokens, kw = int64_t(key_heads) * key_dim,
                  vw = int64_t(value_heads) * value_dim, channels = 2 * kw + vw;
    constexpr int K = 4;
    Scratch mixed(rows * channels * 4), conv_out(rows * channels * 4), z(rows * vw * 4), ab(rows * value_heads * 8),
        gates(rows * value_heads * 8), out(rows * vw * 4), conv_w(channels * K * 4), vec(value_heads * 8 + value_dim * 4),
        conv_state(int64_t(lanes) * (K - 1) * channels * 4), ssm(int64_t(lanes) * value_heads * key_dim * value_dim * 4);
    auto fill = [&](float* p, int64_t n, uint64_t seed, float scale) {
      // bf16 random fill reinterpreted: use the bf16 generator on a temporary and widen.
      cuda::launch_random_bf16(reinterpret_cast<uint16_t*>(p), 2 * n, seed, scale, stream_);
    };
    // Random bit patterns of bf16 pairs read as f32 are finite small values (each f32 is two
    // bf16 of magnitude <= scale: the high half dominates); good enough for timing.
    fill(mixed.f(), rows * channels, 1, 1.0f);
    fill(z.f(), rows * vw, 2, 1.0f);
    fill(ab.f(), rows * value_heads * 2, 3, 1.0f);
    fill(conv_w.f(), channels * K, 4, 0.5f);
    fill(vec.f(), value_heads * 2 + value_dim, 5, 0.5f);
    fill(conv_state.f(), int64_t(lanes) * (K - 1) * channels, 6, 1.0f);
    fill(ssm.f(), int64_t(lanes) * value_heads * key_dim * value_dim, 7, 0.01f);
    std::vector<GdnSeq> host_seqs;
    for (int i = 0; i < lanes; ++i)
      host_seqs.push_back({i * tokens, tokens, conv_state.f() + int64_t(i) * (K - 1) * channels,
                           ssm.f() + int64_t(i) * value_heads * key_dim * value_dim, nullptr, nullptr});
    Scratch seqs(host_seqs.size() * sizeof(GdnSeq));
    NINFER_CUDA_CHECK(cudaMemcpyAsync(seqs.f(), host_seqs.data(), host_seqs.size() * sizeof(GdnSeq),
                                      cudaMemcpyHostToDevice, stream_));
    const auto* sq = reinterpret_cast<const GdnSeq*>(seqs.f());
    float* beta = gates.f();
    float* g = gates.f() + rows * value_heads;
    const float* A_log = vec.f();
    const float* dt_bias = vec.f() + value_heads;
    const float* norm_w = vec.f() + 2 * value_heads;

    auto conv = [&] {
      cuda::launch_causal_conv1d_silu(mixed.f(), channels, channels, conv_w.f(), K, sq, lanes, tokens, conv_out.f(),
                                      channels, stream_);
    };
    auto norm = [&] {
      cuda::launch_l2norm_heads(conv_out.f(), channels, rows, 2 * key_heads, key_dim, 1.0f, 1e-6f, stream_);
    };
    auto gate = [&] {
      cuda::launch_gdn_gates(ab.f(), value_heads, ab.f() + rows * value_heads, value_heads, rows, value_heads, A_log,
                             dt_bias, beta, g, stream_);
    };
    auto rule = [&] {
      cuda::DeltaRuleArgs args{conv_out.f(), conv_out.f() + kw, channels, conv_out.f() + 2 * kw, channels, g, beta,
                               out.f(), vw};
      cuda::launch_gated_delta_rule_recurrent(shape, args, sq, lanes, stream_);
    };
    const bool chunkable = cuda::gdn_chunked_supported(shape);
    const int chunks = static_cast<int>(lanes * cuda::gdn_chunk_count(tokens));
    Scratch workspace(chunkable ? cuda::gdn_chunked_workspace_floats(shape, chunks) * sizeof(float) : 0);
    const cuda::DeltaRuleArgs rule_args{conv_out.f(), conv_out.f() + kw, channels, conv_out.f() + 2 * kw, channels,
                                        g, beta, out.f(), vw};
    auto rule_chunked = [&] {
      cuda::launch_gated_delta_rule_chunked(shape, rule_args, sq, lanes, chunks, workspace.f(), stream_);
    };
    auto chunk_prepare = [&] {
      cuda::launch_gdn_chunk_prepare(shape, rule_args, sq, lanes, chunks, workspace.f(), stream_);
    };
    auto chunk_scan = [&] { cuda::launch_gdn_chunk_scan(shape, rule_args, sq, lanes, workspace.f(), stream_); };
    auto gnorm = [&] {
      cuda::launch_gated_rmsnorm(out.f(), z.f(), rows * value_heads, value_dim, norm_w, 1e-6f, out.f(), stream_);
    };
    auto all = [&] {
      conv();
      norm();
      gate();
      if (tokens >= cuda::kGdnChunkedMinTokens && chunkable)
        rule_chunked();  // as the model runs prefill (GdnForm::Auto)
      else
        rule();
      gnorm();
    };
    std::map<std::string, double> result;
    result["conv"] = median_ms(conv, reps);
    result["l2norm"] = median_ms(norm, reps);
    result["gates"] = median_ms(gate, reps);
    result["delta_rule"] = median_ms(rule, reps);
    if (chunkable) {
      result["delta_rule_chunked"] = median_ms(rule_chunked, reps);
      result["chunk_prepare"] = median_ms(chunk_prepare, reps);
      result["chunk_scan"] = median_ms(chunk_scan, reps);
    }
    result["gated_norm"] = median_ms(gnorm, reps);
    result["total"] = median_ms(all, reps);
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return result;
  }

 private:
  // (row_begin, num_tokens, slot) -> device GdnSeq pointing at slot `slot` of the state arrays
  // and, with a history array, at its rows [row_begin, row_begin + num_tokens) (row_floats each)
  // as the conv history, or the ssm history when `ssm_history`.
  std::pair<std::unique_ptr<Scratch>, int> upload_seqs(const SeqList& seqs, float* conv, int64_t conv_stride,
                                                       float* ssm, int64_t ssm_stride, float* history = nullptr,
                                                       int64_t row_floats = 0, bool ssm_history = false) {
    std::vector<GdnSeq> host;
    int max_tokens = 0;
    for (const auto& [begin, count, slot] : seqs) {
      float* h = history ? history + static_cast<int64_t>(begin) * row_floats : nullptr;
      host.push_back({begin, count, conv ? conv + slot * conv_stride : nullptr, ssm ? ssm + slot * ssm_stride : nullptr,
                      ssm_history ? nullptr : h, ssm_history ? h : nullptr});
      max_tokens = std::max(max_tokens, count);
    }
    auto device = std::make_unique<Scratch>(host.size() * sizeof(GdnSeq));
    NINFER_CUDA_CHECK(
        cudaMemcpyAsync(device->f(), host.data(), host.size() * sizeof(GdnSeq), cudaMemcpyHostToDevice, stream_));
    NINFER_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `host` dies on return
    return {std::move(device), max_tokens};
  }

  template <typename Fn>
  double median_ms(Fn&& fn, int reps) {
    fn();  // warm-up
    cudaEvent_t start, stop;
    NINFER_CUDA_CHECK(cudaEventCreate(&start));
    NINFER_CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<float> times;
    for (int i = 0; i < reps; ++i) {
      NINFER_CUDA_CHECK(cudaEventRecord(start, stream_));
      fn();
      NINFER_CUDA_CHECK(cudaEventRecord(stop, stream_));
      NINFER_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.0f;
      NINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      times.push_back(ms);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(times.begin(), times.end());
    return times.empty() ? 0.0 : times[times.size() / 2];
  }

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

void bind_cuda_hybrid(py::module_& m) {
  py::class_<CudaHybridOps>(m, "CudaHybridOps", "The CUDA hybrid-model kernels on numpy arrays (tests, benchmarks).")
      .def(py::init<int>(), py::arg("device") = 0)
      .def("causal_conv1d_silu", &CudaHybridOps::causal_conv1d_silu, py::arg("x"), py::arg("weight"), py::arg("seqs"),
           py::arg("conv_states"), py::arg("out"), py::arg("history") = std::nullopt)
      .def("l2norm_heads", &CudaHybridOps::l2norm_heads, py::arg("x"), py::arg("scale"), py::arg("eps") = 1e-6f)
      .def("gdn_gates", &CudaHybridOps::gdn_gates, py::arg("b"), py::arg("a"), py::arg("A_log"), py::arg("dt_bias"),
           py::arg("beta"), py::arg("g"))
      .def("gated_delta_rule", &CudaHybridOps::gated_delta_rule, py::arg("q"), py::arg("k"), py::arg("v"),
           py::arg("g"), py::arg("beta"), py::arg("seqs"), py::arg("states"), py::arg("out"),
           py::arg("history") = std::nullopt, py::arg("chunked") = false)
      .def("gated_delta_rule_prepared", &CudaHybridOps::gated_delta_rule_prepared, py::arg("q"), py::arg("k"),
           py::arg("v"), py::arg("a"), py::arg("b"), py::arg("A_log"), py::arg("dt_bias"), py::arg("seqs"),
           py::arg("states"), py::arg("out"), py::arg("history") = std::nullopt, py::arg("overlap") = false)
      .def("gated_rmsnorm", &CudaHybridOps::gated_rmsnorm, py::arg("x"), py::arg("z"), py::arg("weight"),
           py::arg("eps"), py::arg("out"))
      .def("rmsnorm_zero_centered", &CudaHybridOps::rmsnorm_zero_centered, py::arg("x"), py::arg("weight"),
           py::arg("eps"), py::arg("out"))
      .def("split_query_gate", &CudaHybridOps::split_query_gate, py::arg("input"), py::arg("query"), py::arg("gate"))
      .def("sigmoid_gate_multiply", &CudaHybridOps::sigmoid_gate_multiply, py::arg("x"), py::arg("gate"))
      .def("moe_route", &CudaHybridOps::moe_route, py::arg("logits"), py::arg("top_k"), py::arg("renormalize"),
           py::arg("ids"), py::arg("weights"))
      .def("moe_combine", &CudaHybridOps::moe_combine, py::arg("rows"), py::arg("row_of"), py::arg("weights"),
           py::arg("out"))
      .def("moe_add_gated_shared", &CudaHybridOps::moe_add_gated_shared, py::arg("shared"), py::arg("gate_logit"),
           py::arg("out"))
      .def("time_gdn_core", &CudaHybridOps::time_gdn_core, py::arg("lanes"), py::arg("tokens"), py::arg("key_heads"),
           py::arg("value_heads"), py::arg("key_dim"), py::arg("value_dim"), py::arg("reps") = 20);
}
#else
void bind_cuda_hybrid(py::module_&) {}
#endif

}  // namespace ninfer::bindings
