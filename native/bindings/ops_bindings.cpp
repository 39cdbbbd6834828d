// Kernel-level entry points for tests and benchmarks: each CPU op on numpy arrays.
//
// Arrays are used in place (the CPU backend's memory is host memory), so a test can poison an
// output array and see exactly which elements an op wrote. Inputs must already have the right
// dtype and be C-contiguous; nothing is silently converted.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "artifact/artifact.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/quantized_weight.h"
#include "bindings/bindings.h"
#include "cache/kv_pool.h"
#include "common/json.h"
#include "models/rope.h"

namespace py = pybind11;

namespace ninfer::bindings {

namespace {

cpu::CpuBackend& backend_for(int threads) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<cpu::CpuBackend>> backends;
  std::lock_guard lock(mutex);
  auto& slot = backends[threads];
  if (!slot) slot = std::make_unique<cpu::CpuBackend>(threads);
  return *slot;
}

std::string shape_text(const py::array& a) {
  std::string s = "[";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + "]";
}

// Checks dtype, C-contiguity and shape (-1 = any extent) of an array the op reads or writes.
template <typename T>
T* checked(py::array& a, const char* what, std::vector<py::ssize_t> shape, bool writable = false) {
  if (!a.dtype().is(py::dtype::of<T>()))
    throw py::type_error(std::string(what) + ": expected dtype " + std::string(py::str(py::dtype::of<T>())) +
                         ", got " + std::string(py::str(a.dtype())));
  if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string(what) + ": must be C-contiguous");
  if (writable && !a.writeable()) throw py::value_error(std::string(what) + ": must be writable");
  bool ok = a.ndim() == static_cast<py::ssize_t>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || a.shape(static_cast<py::ssize_t>(i)) == shape[i];
  if (!ok) throw py::value_error(std::string(what) + ": unexpected shape " + shape_text(a));
  return static_cast<T*>(writable ? a.mutable_data() : const_cast<void*>(a.data()));
}

// Wraps a raw weight array (f32 [n, k], f16/bf16 bits uint16 [n, k], q8_0 bytes uint8
// [n, k/32*34]; fp8/nvfp4: the tensor's stored bytes, uint8 1-D, with `rows` rows of which
// `group_rows` form one matrix, -1: all) as a Weight with k logical columns.
Weight weight_of(py::array& w, const std::string& dtype_name, int64_t k, int64_t rows = -1,
                 int64_t group_rows = -1) {
  const DType dtype = dtype_from_name(dtype_name);
  if (is_block_quantized(dtype)) {
    if (rows < 1) throw py::value_error("fp8/nvfp4 weights need their row count");
    if (const std::string problem = quantized_shape_problem(dtype, k); !problem.empty()) throw py::value_error(problem);
    const int64_t g = group_rows > 0 ? group_rows : rows;
    if (rows % g) throw py::value_error("rows must be a multiple of group_rows");
    checked<uint8_t>(w, "weight", {QuantizedLayout::of(dtype, rows, k, g).nbytes});
    return quantized_weight_at(dtype, rows, k, g, w.data());
  }
  const int64_t n = w.ndim() == 2 ? w.shape(0) : -1;
  switch (dtype) {
    case DType::F32: checked<float>(w, "weight", {n, k}); break;
    case DType::F16: case DType::BF16: checked<uint16_t>(w, "weight", {n, k}); break;
    case DType::Q8_0:
      if (k % kQ8BlockSize != 0) throw py::value_error("q8_0 weights need k divisible by 32");
      checked<uint8_t>(w, "weight", {n, row_bytes(dtype, k)});
      break;
    case DType::I32: case DType::FP8: case DType::NVFP4: throw py::value_error("i32 is not a weight dtype");
  }
  return Weight{dtype, n, k, w.data()};
}

void matmul(py::array x, py::array w, const std::string& dtype, py::array out, std::optional<py::array> bias,
            int threads, int64_t group_rows) {
  const int64_t m = x.ndim() == 2 ? x.shape(0) : -1, k = x.ndim() == 2 ? x.shape(1) : -1;
  const float* xp = checked<float>(x, "x", {m, k});
  const Weight weight = weight_of(w, dtype, k, out.ndim() == 2 ? out.shape(1) : -1, group_rows);
  float* yp = checked<float>(out, "out", {m, weight.rows}, true);
  const float* bp = bias ? checked<float>(*bias, "bias", {weight.rows}) : nullptr;
  py::gil_scoped_release release;
  backend_for(threads).matmul(xp, m, weight, bp, yp);
}

void embedding(py::array table, const std::string& dtype, py::array tokens, py::array out, int threads) {
  const int64_t n = tokens.ndim() == 1 ? tokens.shape(0) : -1;
  const int64_t cols = out.ndim() == 2 ? out.shape(1) : -1;
  const Weight weight = weight_of(table, dtype, cols);
  const int32_t* ids = checked<int32_t>(tokens, "tokens", {n});
  float* op = checked<float>(out, "out", {n, cols}, true);
  py::gil_scoped_release release;
  backend_for(threads).embedding(weight, std::span(ids, static_cast<size_t>(n)), op);
}

void rms_norm(py::array x, py::array weight, float eps, py::array out, int threads) {
  const int64_t rows = x.ndim() == 2 ? x.shape(0) : -1, cols = x.ndim() == 2 ? x.shape(1) : -1;
  const float* xp = checked<float>(x, "x", {rows, cols});
  const float* wp = checked<float>(weight, "weight", {cols});
  float* op = checked<float>(out, "out", {rows, cols}, true);
  py::gil_scoped_release release;
  backend_for(threads).rms_norm(xp, rows, cols, wp, eps, op);
}

void rope(py::array x, py::array positions, py::array inv_freq, float attention_factor, int threads) {
  const int64_t t = x.ndim() == 3 ? x.shape(0) : -1;
  float* xp = checked<float>(x, "x", {t, -1, -1}, true);
  const int32_t* pp = checked<int32_t>(positions, "positions", {t});
  const float* fp = checked<float>(inv_freq, "inv_freq", {-1});
  const int64_t half = inv_freq.shape(0);
  py::gil_scoped_release release;
  backend_for(threads).rope(xp, x.shape(1), x.shape(2), 2 * half, std::span(pp, static_cast<size_t>(t)),
                            std::span(fp, static_cast<size_t>(half)), attention_factor);
}

void swiglu(py::array gate, py::array up, py::array out, int threads) {
  const int64_t n = gate.ndim() == 1 ? gate.shape(0) : -1;
  const float* gp = checked<float>(gate, "gate", {n});
  const float* upp = checked<float>(up, "up", {n});
  float* op = checked<float>(out, "out", {n}, true);
  py::gil_scoped_release release;
  backend_for(threads).swiglu(gp, upp, n, op);
}

void add(py::array y, py::array x, int threads) {
  const int64_t n = y.ndim() == 1 ? y.shape(0) : -1;
  float* yp = checked<float>(y, "y", {n}, true);
  const float* xp = checked<float>(x, "x", {n});
  py::gil_scoped_release release;
  backend_for(threads).add(yp, xp, n);
}

// Fills a fresh one-layer KV pool with each slice's full key/value history (positions
// [0, start_pos + num_tokens)), then runs causal attention for the slices' query rows.
void paged_attention(py::array q, const std::vector<py::array>& keys, const std::vector<py::array>& values,
                     const std::vector<std::tuple<int, int, std::vector<int32_t>>>& slices, int64_t num_pages,
                     float scale, py::array out, int threads, const std::string& kv_dtype) {
  if (keys.size() != slices.size() || values.size() != slices.size())
    throw py::value_error("need one key and one value history per slice");
  if (keys.empty()) throw py::value_error("need at least one slice");
  const int64_t rows = q.ndim() == 3 ? q.shape(0) : -1;
  const float* qp = checked<float>(q, "q", {rows, -1, -1});
  const int64_t nh = q.shape(1), hd = q.shape(2);
  float* op = checked<float>(out, "out", {rows, nh, hd}, true);
  py::array k0 = keys[0];
  const int64_t nkv = k0.ndim() == 3 ? k0.shape(1) : -1;
  KvPool pool(num_pages, 1, nkv, hd, kv_dtype_from_name(kv_dtype));
  cpu::CpuBackend& backend = backend_for(threads);
  std::vector<AttentionSlice> plan;
  int32_t row = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    const auto& [start, count, pages] = slices[i];
    py::array kh = keys[i], vh = values[i];
    const float* kp = checked<float>(kh, "keys", {start + count, nkv, hd});
    const float* vp = checked<float>(vh, "values", {start + count, nkv, hd});
    const AttentionSlice history{0, start + count, 0, pages.data(), static_cast<int32_t>(pages.size())};
    backend.kv_write(pool, 0, kp, vp, std::span(&history, 1));
    plan.push_back({row, count, start, pages.data(), static_cast<int32_t>(pages.size())});
    row += count;
  }
  if (row != rows) throw py::value_error("q rows do not match the slices' token counts");
  const AttentionShape shape{nh, nkv, hd, scale};
  py::gil_scoped_release release;
  backend.attention(pool, 0, qp, plan, shape, op);
}

py::tuple rope_inv_freq(const std::string& config_json, int64_t seq_len) {
  const RopeScaling scaling(json::Value::parse(config_json));
  const RopeTable table = scaling.table(seq_len);
  py::array_t<float> inv(static_cast<py::ssize_t>(table.inv_freq.size()));
  std::copy(table.inv_freq.begin(), table.inv_freq.end(), inv.mutable_data());
  return py::make_tuple(inv, table.attention_factor);
}

// The host KV codec on rows of head_dim values: (codes [rows, code_bytes] uint8, group scales
// [rows, head_dim/16] uint8 (nvfp4; else [rows, 0]), scales [rows] f32, dequantized [rows, hd]).
py::tuple kv_quantize(py::array x, const std::string& kv_dtype) {
  const KvDType t = kv_dtype_from_name(kv_dtype);
  if (t == KvDType::BF16) throw py::value_error("kv_quantize: bf16 is not a quantized KV format");
  if (x.ndim() != 2) throw py::value_error("kv_quantize: x must be [rows, head_dim]");
  const int64_t rows = x.shape(0), hd = x.shape(1);
  if (hd % kKvGroup != 0) throw py::value_error("kv_quantize: head_dim must be a multiple of 16");
  const float* xp = checked<float>(x, "x", {rows, hd});
  const KvRegion r = KvRegion::of(t, 1, 1, hd);
  py::array_t<uint8_t> codes({rows, r.code_bytes}), groups({rows, r.group_bytes});
  py::array_t<float> scales(rows), values({rows, hd});
  for (int64_t i = 0; i < rows; ++i) {
    kvcodec::quantize_row(t, xp + i * hd, hd, codes.mutable_data(i), groups.mutable_data() + i * r.group_bytes,
                          scales.mutable_data(i));
    kvcodec::dequantize_row(t, codes.data(i), groups.data() + i * r.group_bytes, scales.data(i)[0], hd,
                            values.mutable_data(i));
  }
  return py::make_tuple(codes, groups, scales, values);
}

}  // namespace

void bind_ops(py::module_& m) {
  m.def("kv_quantize", &kv_quantize, py::arg("x"), py::arg("kv_dtype"),
        "Quantizes [rows, head_dim] f32 rows in a --kv-dtype format: (codes, group_scales, scales, dequantized).");
  m.def("kv_page_bytes", [](const std::string& kv_dtype, int64_t layers, int64_t kv_heads, int64_t head_dim,
                            int64_t element_bytes) {
    return KvPool(1, layers, kv_heads, head_dim, kv_dtype_from_name(kv_dtype)).page_bytes(element_bytes);
  }, py::arg("kv_dtype"), py::arg("layers"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("element_bytes"),
        "Bytes of one 64-token KV page (all layers, K and V) in a --kv-dtype format.");
  m.def("set_cpu_kernels", [](const std::string& name) { cpu::select_cpu_kernels(name); }, py::arg("name"),
        "Selects the CPU kernel set: 'auto', 'scalar', 'avx2', 'avxvnni' or 'avx512vnni'.");
  m.def("cpu_kernels", [] { return std::string(cpu::cpu_kernels().name); }, "Name of the active CPU kernel set.");
  m.def(
      "best_cpu_kernels",
      [](bool avx2_fma_f16c, bool avxvnni, bool avx512_f_bw_dq_vl_vnni) {
        return std::string(cpu::best_kernel_name({avx2_fma_f16c, avxvnni, avx512_f_bw_dq_vl_vnni}));
      },
      py::arg("avx2_fma_f16c"), py::arg("avxvnni"), py::arg("avx512_f_bw_dq_vl_vnni"),
      "The kernel set 'auto' picks on a CPU with these features (whether or not this one has them).");
  m.def("matmul", &matmul, py::arg("x"), py::arg("w"), py::arg("dtype"), py::arg("out"),
        py::arg("bias") = py::none(), py::arg("threads") = 0, py::arg("group_rows") = -1,
        "out[m, n] = x[m, k] @ w[n, k]^T (+ bias). w: f32 [n,k]; f16/bf16 bits uint16 [n,k]; "
        "q8_0 block bytes uint8 [n, k/32*34]; fp8/nvfp4: the stored tensor bytes, uint8 1-D "
        "(group_rows: rows per matrix of a stack, -1: n).");
  m.def("embedding", &embedding, py::arg("table"), py::arg("dtype"), py::arg("tokens"), py::arg("out"),
        py::arg("threads") = 0);
  m.def("rms_norm", &rms_norm, py::arg("x"), py::arg("weight"), py::arg("eps"), py::arg("out"),
        py::arg("threads") = 0);
  m.def("rope", &rope, py::arg("x"), py::arg("positions"), py::arg("inv_freq"), py::arg("attention_factor") = 1.0f,
        py::arg("threads") = 0, "Rotates x[tokens, heads, head_dim] in place (HF rotate_half).");
  m.def("swiglu", &swiglu, py::arg("gate"), py::arg("up"), py::arg("out"), py::arg("threads") = 0);
  m.def("add", &add, py::arg("y"), py::arg("x"), py::arg("threads") = 0);
  m.def("paged_attention", &paged_attention, py::arg("q"), py::arg("keys"), py::arg("values"), py::arg("slices"),
        py::arg("num_pages"), py::arg("scale"), py::arg("out"), py::arg("threads") = 0, py::arg("kv_dtype") = "bf16",
        "slices: [(start_pos, num_tokens, page_table)]; keys/values[i]: [start_pos+num_tokens, kv_heads, head_dim].");
  m.def("rope_inv_freq", &rope_inv_freq, py::arg("config_json"), py::arg("seq_len"),
        "(inv_freq, attention_factor) for an HF-style config JSON at a sequence length.");
  bind_model_runner(m);
}

}  // namespace ninfer::bindings
