// Kernel-level entry points of the CUDA backend for tests and benchmarks.
//
// Each call copies its numpy inputs to the device, runs one backend op and copies the
// outputs back into the given arrays. Outputs are uploaded first as well, so a test that
// poisons an output array sees exactly which elements the op wrote. Without a CUDA build
// only cuda_device_count() exists (it returns 0).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "artifact/artifact.h"
#include "bindings/bindings.h"
#include "cache/kv_pool.h"

#ifdef NINFER_WITH_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/launchers.h"
#endif

namespace py = pybind11;

namespace ninfer::bindings {

#ifdef NINFER_WITH_CUDA
namespace {

using cuda::CudaBackend;

template <typename T>
T* data_of(py::array& a, const char* what, bool writable = false) {
  if (!a.dtype().is(py::dtype::of<T>()))
    throw py::type_error(std::string(what) + ": expected dtype " + std::string(py::str(py::dtype::of<T>())));
  if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string(what) + ": must be C-contiguous");
  return static_cast<T*>(writable ? a.mutable_data() : const_cast<void*>(a.data()));
}

// A float32 numpy array mirrored in device memory.
class Mirror {
 public:
  Mirror(CudaBackend& backend, py::array array, const char* what) : backend_(backend), array_(std::move(array)) {
    host_ = data_of<float>(array_, what);
    buffer_ = backend.alloc(array_.size());
    backend.copy_from_host(buffer_.data(), host_, array_.size());
  }
  float* device() const { return buffer_.data(); }
  void download() {
    if (!array_.writeable()) throw py::value_error("output array must be writable");
    backend_.copy_to_host(static_cast<float*>(array_.mutable_data()), buffer_.data(), array_.size());
  }

 private:
  CudaBackend& backend_;
  py::array array_;
  const float* host_ = nullptr;
  Buffer buffer_;
};

CudaBackend::MatmulPath matmul_path(const std::string& name) {
  if (name == "auto") return CudaBackend::MatmulPath::Auto;
  if (name == "gemv") return CudaBackend::MatmulPath::Gemv;
  if (name == "cublas") return CudaBackend::MatmulPath::Cublas;
  throw py::value_error("matmul path must be auto, gemv or cublas");
}

CudaBackend::MoePath moe_path(const std::string& name) {
  if (name == "auto") return CudaBackend::MoePath::Auto;
  if (name == "gemv") return CudaBackend::MoePath::Gemv;
  if (name == "grouped") return CudaBackend::MoePath::Grouped;
  if (name == "host") return CudaBackend::MoePath::Host;
  throw py::value_error("moe path must be auto, gemv, grouped or host");
}

CudaBackend::AttentionPath attention_path(const std::string& name) {
  if (name == "auto") return CudaBackend::AttentionPath::Auto;
  if (name == "decode") return CudaBackend::AttentionPath::Decode;
  if (name == "prefill") return CudaBackend::AttentionPath::Prefill;
  throw py::value_error("attention path must be auto, decode or prefill");
}

class CudaOps {
 public:
  explicit CudaOps(int device) : backend_(device) {}

  bool cublas_available() const { return backend_.cublas_available(); }

  // w: f32 [n,k]; f16/bf16 bits uint16 [n,k]; q8_0 bytes uint8 [n, k/32*34].
  Weight weight(py::array w, const std::string& dtype_name, int64_t k) {
    const DType dtype = dtype_from_name(dtype_name);
    if (w.ndim() != 2) throw py::value_error("weight must be 2-D");
    TensorView view;
    view.name = "weight";
    view.dtype = dtype;
    view.shape = {w.shape(0), k};
    view.nbytes = static_cast<uint64_t>(w.nbytes());
    view.data = w.data();
    return backend_.upload_weight(view);
  }

  void matmul_many(py::array x, const std::vector<py::array>& weights, const std::string& dtype,
                   const std::vector<py::array>& outs, const std::vector<std::optional<py::array>>& biases,
                   const std::string& path) {
    if (x.ndim() != 2 || weights.empty() || weights.size() != outs.size() || biases.size() != outs.size())
      throw py::value_error("matmul_many: x [m, k], and one weight, out and bias (or None) each");
    const int64_t m = x.shape(0), k = x.shape(1);
    Mirror xd(backend_, x, "x");
    std::vector<Weight> ws;
    std::vector<Mirror> ys, bs;
    ys.reserve(outs.size());
    bs.reserve(outs.size());
    std::vector<MatmulOutput> outputs;
    for (size_t i = 0; i < weights.size(); ++i) ws.push_back(weight(weights[i], dtype, k));
    for (size_t i = 0; i < weights.size(); ++i) {
      ys.emplace_back(backend_, outs[i], "out");
      const float* bias = nullptr;
      if (biases[i]) {
        bs.emplace_back(backend_, *biases[i], "bias");
        bias = bs.back().device();
      }
      outputs.push_back({&ws[i], bias, ys.back().device()});
    }
    backend_.set_matmul_path(matmul_path(path));
    backend_.matmul_many(xd.device(), m, outputs);
    backend_.set_matmul_path(CudaBackend::MatmulPath::Auto);
    for (auto& y : ys) y.download();
  }

  void embedding(py::array table, const std::string& dtype, py::array tokens, py::array out) {
    const Weight w = weight(table, dtype, out.shape(1));
    const int32_t* ids = data_of<int32_t>(tokens, "tokens");
    Mirror o(backend_, out, "out");
    backend_.embedding(w, std::span(ids, static_cast<size_t>(tokens.size())), o.device());
    o.download();
  }

  py::array_t<float> random_weight(int64_t rows, int64_t cols, uint64_t seed, float scale) {
    const Weight w = backend_.random_weight(rows, cols, seed, scale);
    py::array_t<float> out({rows, cols});
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    Mirror o(backend_, out, "out");
    backend_.embedding(w, ids, o.device());
    o.download();
    return out;
  }

  void rms_norm(py::array x, py::array weight, float eps, py::array out) {
    Mirror xd(backend_, x, "x"), wd(backend_, weight, "weight"), od(backend_, out, "out");
    backend_.rms_norm(xd.device(), x.shape(0), x.shape(1), wd.device(), eps, od.device());
    od.download();
  }

  // x [rows, head_dim]; out may be x (in place, as the models call it).
  void head_rms_norm(py::array x, py::array weight, float eps, py::array out) {
    Mirror xd(backend_, x, "x"), wd(backend_, weight, "weight");
    if (out.is(x)) {
      backend_.head_rms_norm(xd.device(), x.shape(0), x.shape(1), wd.device(), eps, xd.device());
      xd.download();
      return;
    }
    Mirror od(backend_, out, "out");
    backend_.head_rms_norm(xd.device(), x.shape(0), x.shape(1), wd.device(), eps, od.device());
    od.download();
  }

  void add_rms_norm(py::array h, py::array branch, py::array weight, float eps, py::array out) {
    Mirror hd(backend_, h, "h"), bd(backend_, branch, "branch"), wd(backend_, weight, "weight"),
        od(backend_, out, "out");
    backend_.add_rms_norm(hd.device(), bd.device(), h.shape(0), h.shape(1), wd.device(), eps, od.device());
    hd.download();
    od.download();
  }

  void rope(py::array x, py::array positions, py::array inv_freq, float factor) {
    if (x.ndim() != 3) throw py::value_error("x must be [tokens, heads, head_dim]");
    Mirror xd(backend_, x, "x");
    const int32_t* pos = data_of<int32_t>(positions, "positions");
    const float* freq = data_of<float>(inv_freq, "inv_freq");
    backend_.rope(xd.device(), x.shape(1), x.shape(2), 2 * inv_freq.size(), std::span(pos, positions.size()),
                  std::span(freq, inv_freq.size()), factor);
    xd.download();
  }

  void swiglu(py::array gate, py::array up, py::array out) {
    Mirror g(backend_, gate, "gate"), u(backend_, up, "up"), o(backend_, out, "out");
    backend_.swiglu(g.device(), u.device(), gate.size(), o.device());
    o.download();
  }

  // out = matmul(silu(gate) * up, weight) by the backend's fused MLP op (gate is scratch).
  void swiglu_matmul(py::array gate, py::array up, py::array weight_data, const std::string& dtype, py::array out) {
    if (gate.ndim() != 2 || up.ndim() != 2 || out.ndim() != 2 || gate.shape(0) != out.shape(0))
      throw py::value_error("swiglu_matmul: gate, up [m, k] and out [m, rows]");
    TensorView view;  // the weight [out.shape(1), k] as stored (bf16 bits, or a quantized blob)
    view.name = "down";
    view.dtype = dtype_from_name(dtype);
    view.shape = {out.shape(1), gate.shape(1)};
    view.nbytes = static_cast<uint64_t>(weight_data.nbytes());
    view.data = weight_data.data();
    view.group_rows = out.shape(1);  // one matrix
    const Weight w = backend_.upload_weight(view);
    Mirror g(backend_, gate, "gate"), u(backend_, up, "up"), o(backend_, out, "out");
    backend_.swiglu_matmul(g.device(), u.device(), gate.shape(0), w, o.device());
    o.download();
  }

  void add(py::array y, py::array x) {
    Mirror yd(backend_, y, "y"), xd(backend_, x, "x");
    backend_.add(yd.device(), xd.device(), y.size());
    yd.download();
  }

  void gather_rows(py::array src, py::array rows, py::array out) {
    Mirror s(backend_, src, "src"), o(backend_, out, "out");
    const int32_t* r = data_of<int32_t>(rows, "rows");
    backend_.gather_rows(s.device(), src.shape(1), std::span(r, rows.size()), o.device());
    o.download();
  }

  // As ops_bindings' paged_attention: writes each slice's history into a fresh one-layer pool
  // (through kv_write), then attends for the slices' query rows.
  void paged_attention(py::array q, const std::vector<py::array>& keys, const std::vector<py::array>& values,
                       const std::vector<std::tuple<int, int, std::vector<int32_t>>>& slices, int64_t num_pages,
                       float scale, py::array out, const std::string& path, int splits,
                       int prefill_kv_stages, const std::string& kv_dtype, py::object read_pages) {
    if (keys.size() != slices.size() || values.size() != slices.size() || keys.empty())
      throw py::value_error("need one key and one value history per slice");
    if (q.ndim() != 3) throw py::value_error("q must be [rows, heads, head_dim]");
    const int64_t nh = q.shape(1), hd = q.shape(2), nkv = keys[0].shape(1);
    KvPool pool(num_pages, 1, nkv, hd, kv_dtype_from_name(kv_dtype));
    Mirror qd(backend_, q, "q"), od(backend_, out, "out");
    std::vector<AttentionSlice> plan;
    int32_t row = 0;
    for (size_t i = 0; i < slices.size(); ++i) {
      const auto& [start, count, pages] = slices[i];
      Mirror kd(backend_, keys[i], "keys"), vd(backend_, values[i], "values");
      const AttentionSlice history{0, start + count, 0, pages.data(), static_cast<int32_t>(pages.size())};
      backend_.kv_write(pool, 0, kd.device(), vd.device(), std::span(&history, 1));
      backend_.synchronize();  // the mirrors free their buffers on scope exit
      plan.push_back({row, count, start, pages.data(), static_cast<int32_t>(pages.size())});
      row += count;
    }
    if (row != q.shape(0)) throw py::value_error("q rows do not match the slices' token counts");
    backend_.set_attention_path(attention_path(path));
    backend_.set_decode_splits(splits);
    backend_.set_prefill_kernel({prefill_kv_stages});
    auto reset = [this] {
      backend_.set_attention_path(CudaBackend::AttentionPath::Auto);
      backend_.set_decode_splits(0);
      backend_.set_prefill_kernel({});
    };
    try {
      backend_.attention(pool, 0, qd.device(), plan, AttentionShape{nh, nkv, hd, scale}, od.device());
    } catch (...) {
      reset();
      throw;
    }
    reset();
    od.download();
    if (!read_pages.is_none()) {  // called with the pool's pages as stored (codes and scales of a quantized one)
      const int64_t bytes = pool.page_bytes(2);
      py::array_t<uint8_t> stored({num_pages, bytes});
      for (int64_t pg = 0; pg < num_pages; ++pg)
        backend_.kv_page_io(pool, static_cast<int32_t>(pg), stored.mutable_data(pg), true);
      read_pages(stored);
    }
  }

  // Median device time (ms) of the prefill attention kernel alone for one slice of `tokens`
  // queries after `start` cached keys, on seeded random q and KV (pages in order), with
  // prefill_kv_stages K/V buffers (0 = the default).
  double time_prefill_attention(int start, int tokens, int num_heads, int num_kv_heads, int head_dim,
                                int prefill_kv_stages, int reps) {
    if (tokens <= 0 || start < 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || reps <= 0)
      throw py::value_error("time_prefill_attention: bad shape");
    const int total = start + tokens, num_pages = (total + kPageTokens - 1) / kPageTokens;
    const int64_t page_elems = int64_t(kPageTokens) * num_kv_heads * head_dim;
    const int64_t q_elems = int64_t(tokens) * num_heads * head_dim;
    std::vector<int32_t> pages(static_cast<size_t>(num_pages));
    for (int i = 0; i < num_pages; ++i) pages[static_cast<size_t>(i)] = i;
    std::vector<cuda::PrefillItem> items;
    for (int r = 0; r < tokens; r += cuda::kPrefillBlockRows)
      items.push_back({r, std::min(cuda::kPrefillBlockRows, tokens - r), start + r, 0});
    std::reverse(items.begin(), items.end());  // as the backend's plan: longest rows first

    const size_t kv_bytes = size_t(num_pages) * 2 * page_elems * 2, q_bytes = size_t(q_elems) * 4;
    const size_t pages_bytes = pages.size() * 4, items_bytes = items.size() * sizeof(cuda::PrefillItem);
    void *kv = nullptr, *q = nullptr, *out = nullptr, *plan = nullptr;
    NINFER_CUDA_CHECK(cudaMalloc(&kv, kv_bytes));
    NINFER_CUDA_CHECK(cudaMalloc(&q, q_bytes));
    NINFER_CUDA_CHECK(cudaMalloc(&out, q_bytes));
    NINFER_CUDA_CHECK(cudaMalloc(&plan, pages_bytes + items_bytes));
    auto free_all = [&] {
      cudaDeviceSynchronize();
      cudaFree(kv);
      cudaFree(q);
      cudaFree(out);
      cudaFree(plan);
    };
    cudaEvent_t begin = nullptr, end = nullptr;
    std::vector<float> times;
    try {
      NINFER_CUDA_CHECK(cudaMemcpy(plan, pages.data(), pages_bytes, cudaMemcpyHostToDevice));
      auto* device_items = reinterpret_cast<cuda::PrefillItem*>(static_cast<char*>(plan) + pages_bytes);
      NINFER_CUDA_CHECK(cudaMemcpy(device_items, items.data(), items_bytes, cudaMemcpyHostToDevice));
      cuda::launch_random_bf16(static_cast<cuda::bf16_bits*>(kv), int64_t(kv_bytes / 2), 1, 1.0f, nullptr);
      // Random bf16 pairs read as f32: each value is about its high half, in (-3, 3).
      cuda::launch_random_bf16(static_cast<cuda::bf16_bits*>(q), 2 * q_elems, 2, 3.0f, nullptr);
      const cuda::KvLayout layout{kv, num_pages, page_elems, num_kv_heads, 0};
      const cuda::AttentionArgs args{layout, static_cast<const int32_t*>(plan), static_cast<const float*>(q),
                                     static_cast<float*>(out), num_heads, head_dim,
                                     1.0f / std::sqrt(static_cast<float>(head_dim))};
      const cuda::PrefillKernelConfig config{prefill_kv_stages};
      auto run = [&] {
        cuda::launch_prefill_attention(args, device_items, static_cast<int>(items.size()), nullptr, config);
      };
      run();  // warm-up (and the kernel's one-time attribute setup)
      NINFER_CUDA_CHECK(cudaEventCreate(&begin));
      NINFER_CUDA_CHECK(cudaEventCreate(&end));
      for (int i = 0; i < reps; ++i) {
        NINFER_CUDA_CHECK(cudaEventRecord(begin, nullptr));
        run();
        NINFER_CUDA_CHECK(cudaEventRecord(end, nullptr));
        NINFER_CUDA_CHECK(cudaEventSynchronize(end));
        float ms = 0.0f;
        NINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, begin, end));
        times.push_back(ms);
      }
    } catch (...) {
      if (begin) cudaEventDestroy(begin);
      if (end) cudaEventDestroy(end);
      free_all();
      throw;
    }
    cudaEventDestroy(begin);
    cudaEventDestroy(end);
    free_all();
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

  // Backend::moe_experts on a path ("auto", "gemv", "grouped", "host"). gate_up [E·2ff, hidden]
  // and down [E·hidden, ff] are bf16 bit patterns (uint16).
  void moe_experts(py::array x, py::array router_logits, py::array gate_up, py::array down, int64_t top_k,
                   bool renormalize, py::array out, const std::string& path, int tile_rows,
                   int tile_cols) {
    if (x.ndim() != 2 || router_logits.ndim() != 2 || gate_up.ndim() != 2 || down.ndim() != 2)
      throw py::value_error("moe_experts: x [tokens, hidden], router_logits [tokens, E], 2-D weights");
    const int64_t tokens = x.shape(0), hidden = x.shape(1), experts = router_logits.shape(1);
    MoeExperts moe;
    moe.gate_up = weight(gate_up, "bf16", hidden);
    moe.down = weight(down, "bf16", down.shape(1));
    moe.num_experts = experts;
    moe.ff = down.shape(1);
    moe.top_k = top_k;
    moe.renormalize = renormalize;
    Mirror xd(backend_, x, "x"), ld(backend_, router_logits, "router_logits"), od(backend_, out, "out");
    run_with_moe_path(path, tile_rows, tile_cols,
                      [&] { backend_.moe_experts(xd.device(), tokens, hidden, ld.device(), moe, od.device()); });
    od.download();
  }

  // Median device time (ms) of moe_experts on a path for x [tokens, hidden] and the given router
  // logits, with seeded random bf16 experts made on the device (kept for later calls).
  double time_moe_experts(py::array x, py::array router_logits, int64_t ff, int64_t top_k, const std::string& path,
                          int tile_rows, int tile_cols, int reps) {
    const int64_t tokens = x.shape(0), hidden = x.shape(1), experts = router_logits.shape(1);
    const std::tuple<int64_t, int64_t, int64_t> key{experts, ff, hidden};
    if (timed_experts_key_ != key) {
      timed_experts_.gate_up = backend_.random_weight(experts * 2 * ff, hidden, 101, 0.05f);
      timed_experts_.down = backend_.random_weight(experts * hidden, ff, 102, 0.05f);
      timed_experts_key_ = key;
    }
    timed_experts_.num_experts = experts;
    timed_experts_.ff = ff;
    timed_experts_.top_k = top_k;
    Mirror xd(backend_, x, "x"), ld(backend_, router_logits, "router_logits");
    Buffer out = backend_.alloc(tokens * hidden);
    std::vector<float> times;
    run_with_moe_path(path, tile_rows, tile_cols, [&] {
      auto once = [&] { backend_.moe_experts(xd.device(), tokens, hidden, ld.device(), timed_experts_, out.data()); };
      once();  // warm-up: scratch growth, cuBLAS plans
      cudaEvent_t start, stop;
      cudaEventCreate(&start);
      cudaEventCreate(&stop);
      for (int i = 0; i < reps; ++i) {
        cudaEventRecord(start, backend_.stream());
        once();
        cudaEventRecord(stop, backend_.stream());
        cudaEventSynchronize(stop);
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, start, stop);
        times.push_back(ms);
      }
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
    });
    std::sort(times.begin(), times.end());
    return times.empty() ? 0.0 : times[times.size() / 2];
  }

 private:
  template <typename Fn>
  void run_with_moe_path(const std::string& path, int tile_rows, int tile_cols, Fn&& fn) {
    backend_.set_moe_path(moe_path(path), tile_rows, tile_cols);
    try {
      fn();
    } catch (...) {
      backend_.set_moe_path(CudaBackend::MoePath::Auto);
      throw;
    }
    backend_.set_moe_path(CudaBackend::MoePath::Auto);
  }

  CudaBackend backend_;
  MoeExperts timed_experts_;
  std::tuple<int64_t, int64_t, int64_t> timed_experts_key_{0, 0, 0};
};

}  // namespace
#endif

void bind_cuda(py::module_& m) {
#ifdef NINFER_WITH_CUDA
  m.def("cuda_device_count", [] { return cuda::device_count(); }, "CUDA devices visible (0 without driver/device).");
  m.def("cuda_graph_replays", [] { return cuda::graph_replays_total(); },
        "Decode steps replayed as CUDA graphs by every CUDA backend of this process.");
  py::class_<CudaOps>(m, "CudaOps", "Each CUDA backend op on numpy arrays (tests, benchmarks).")
      .def(py::init<int>(), py::arg("device") = 0)
      .def_property_readonly("cublas_available", &CudaOps::cublas_available)
      .def("matmul_many", &CudaOps::matmul_many, py::arg("x"), py::arg("weights"), py::arg("dtype"), py::arg("outs"),
           py::arg("biases"), py::arg("path") = "auto")
      .def("embedding", &CudaOps::embedding, py::arg("table"), py::arg("dtype"), py::arg("tokens"), py::arg("out"))
      .def("random_weight", &CudaOps::random_weight, py::arg("rows"), py::arg("cols"), py::arg("seed"),
           py::arg("scale"))
      .def("rms_norm", &CudaOps::rms_norm, py::arg("x"), py::arg("weight"), py::arg("eps"), py::arg("out"))
      .def("head_rms_norm", &CudaOps::head_rms_norm, py::arg("x"), py::arg("weight"), py::arg("eps"), py::arg("out"))
      .def("add_rms_norm", &CudaOps::add_rms_norm, py::arg("h"), py::arg("branch"), py::arg("weight"), py::arg("eps"),
           py::arg("out"))
      .def("rope", &CudaOps::rope, py::arg("x"), py::arg("positions"), py::arg("inv_freq"),
           py::arg("attention_factor") = 1.0f)
      .def("swiglu", &CudaOps::swiglu, py::arg("gate"), py::arg("up"), py::arg("out"))
      .def("swiglu_matmul", &CudaOps::swiglu_matmul, py::arg("gate"), py::arg("up"), py::arg("weight"),
           py::arg("dtype"), py::arg("out"))
      .def("add", &CudaOps::add, py::arg("y"), py::arg("x"))
      .def("gather_rows", &CudaOps::gather_rows, py::arg("src"), py::arg("rows"), py::arg("out"))
      .def("moe_experts", &CudaOps::moe_experts, py::arg("x"), py::arg("router_logits"), py::arg("gate_up"),
           py::arg("down"), py::arg("top_k"), py::arg("renormalize"), py::arg("out"), py::arg("path") = "auto",
           py::arg("tile_rows") = 0, py::arg("tile_cols") = 0)
      .def("time_moe_experts", &CudaOps::time_moe_experts, py::arg("x"), py::arg("router_logits"), py::arg("ff"),
           py::arg("top_k"), py::arg("path") = "auto", py::arg("tile_rows") = 0, py::arg("tile_cols") = 0,
           py::arg("reps") = 10)
      .def("paged_attention", &CudaOps::paged_attention, py::arg("q"), py::arg("keys"), py::arg("values"),
           py::arg("slices"), py::arg("num_pages"), py::arg("scale"), py::arg("out"), py::arg("path") = "auto",
           py::arg("splits") = 0, py::arg("prefill_kv_stages") = 0, py::arg("kv_dtype") = "bf16",
           py::arg("read_pages") = py::none())
      .def("time_prefill_attention", &CudaOps::time_prefill_attention, py::arg("start"), py::arg("tokens"),
           py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("head_dim"),
           py::arg("prefill_kv_stages") = 0, py::arg("reps") = 10);
  bind_cuda_hybrid(m);
  bind_cuda_gemv(m);
  bind_cuda_quant(m);
  bind_cuda_moe_decode(m);
  bind_cuda_fp8_gemm(m);
#else
  m.def("cuda_device_count", [] { return 0; }, "CUDA devices visible (this build has no CUDA backend).");
  m.def("cuda_graph_replays", [] { return 0; }, "Decode steps replayed as CUDA graphs (no CUDA backend: 0).");
#endif
}

}  // namespace ninfer::bindings
