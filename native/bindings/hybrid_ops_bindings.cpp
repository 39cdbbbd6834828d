// Test bindings of the Qwen3.5/3.6 hybrid-layer CPU kernels, as `_core.hybrid`. Each function
// takes numpy arrays, checks their shapes, and returns new arrays (state arguments are copied,
// updated and returned) so that tests can compare against torch references.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/gated_attention_cpu.h"
#include "backends/cpu/gdn_cpu.h"
#include "backends/cpu/moe_cpu.h"
#include "cache/gdn_state_slots.h"
#include "bindings/bindings.h"

namespace py = pybind11;

namespace ninfer::bindings {
namespace {

using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
using I32 = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

template <typename Array>
void expect_shape(const Array& a, std::vector<int64_t> shape, const char* name) {
  bool ok = a.ndim() == static_cast<py::ssize_t>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || a.shape(i) == shape[i];
  if (ok) return;
  // std::to_string, not an ostringstream: formatted iostream I/O crashed in the GPU machine's
  // Python process (see host_available_bytes in backends/cpu/cpu_attention.cpp).
  std::string msg = name;
  msg.append(": expected shape [");
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) msg.append(", ");
    msg.append(shape[i] < 0 ? std::string("?") : std::to_string(shape[i]));
  }
  msg.append("], got [");
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    if (i) msg.append(", ");
    msg.append(std::to_string(a.shape(i)));
  }
  msg.append("]");
  throw std::invalid_argument(msg);
}

F32 empty_like_shape(std::vector<py::ssize_t> shape) { return F32(shape); }

F32 copy_of(const F32& a) {
  F32 out(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
  std::copy(a.data(), a.data() + a.size(), out.mutable_data());
  return out;
}

// A ParallelRange on real threads (threads > 1) so tests exercise concurrent work items.
cpu::ParallelRange thread_range(int threads) {
  return [threads](int64_t count, const std::function<void(int64_t, int64_t)>& body) {
    const int64_t parts = std::min<int64_t>(threads, count);
    std::vector<std::thread> pool;
    for (int64_t p = 0; p < parts; ++p)
      pool.emplace_back([&, p] { body(count * p / parts, count * (p + 1) / parts); });
    for (auto& t : pool) t.join();
  };
}

cpu::GdnDims dims_of(const F32& q, const F32& v) {
  expect_shape(q, {-1, -1, -1}, "q");
  expect_shape(v, {q.shape(0), -1, -1}, "v");
  cpu::GdnDims d{q.shape(1), v.shape(1), q.shape(2), v.shape(2)};
  d.validate();
  return d;
}

struct DeltaRuleArgs {
  cpu::GdnDims dims;
  int64_t tokens;
  F32 out, state;
  cpu::DeltaRuleIo io;
};

DeltaRuleArgs delta_rule_args(const F32& q, const F32& k, const F32& v, const F32& g,
                              const F32& beta, const F32& state) {
  DeltaRuleArgs args{dims_of(q, v), q.shape(0), {}, {}, {}};
  const auto& d = args.dims;
  expect_shape(k, {args.tokens, d.key_heads, d.key_dim}, "k");
  expect_shape(g, {args.tokens, d.value_heads}, "g");
  expect_shape(beta, {args.tokens, d.value_heads}, "beta");
  expect_shape(state, {d.value_heads, d.key_dim, d.value_dim}, "state");
  args.out = empty_like_shape({args.tokens, d.value_heads, d.value_dim});
  args.state = copy_of(state);
  args.io = {q.data(), k.data(), d.key_width(), v.data(), d.value_width(), g.data(), beta.data(),
             args.out.mutable_data(), d.value_width()};
  return args;
}

void bind_gdn(py::module_& h) {
  h.def(
      "causal_conv1d_silu",
      [](const F32& x, const F32& weight, const F32& state, int threads) {
        expect_shape(x, {-1, -1}, "x");
        expect_shape(weight, {x.shape(1), -1}, "weight");
        expect_shape(state, {weight.shape(1) - 1, x.shape(1)}, "conv_state");
        F32 out = empty_like_shape({x.shape(0), x.shape(1)});
        F32 new_state = copy_of(state);
        const auto range = thread_range(threads);
        cpu::causal_conv1d_silu(x.data(), x.shape(1), x.shape(0), x.shape(1), weight.data(),
                                weight.shape(1), new_state.mutable_data(), out.mutable_data(),
                                x.shape(1), threads > 1 ? &range : nullptr);
        return py::make_tuple(out, new_state);
      },
      py::arg("x"), py::arg("weight"), py::arg("conv_state"), py::arg("threads") = 1,
      "x [T, C], weight [C, K], conv_state [K-1, C] -> (silu(conv) [T, C], new conv_state)");
  h.def(
      "l2norm_heads",
      [](const F32& x, float scale, float eps) {
        expect_shape(x, {-1, -1, -1}, "x");
        F32 out = copy_of(x);
        cpu::l2norm_heads(out.mutable_data(), x.shape(1) * x.shape(2), x.shape(0), x.shape(1),
                          x.shape(2), scale, eps);
        return out;
      },
      py::arg("x"), py::arg("scale") = 1.0f, py::arg("eps") = 1e-6f);
  h.def(
      "gdn_gates",
      [](const F32& b, const F32& a, const F32& A_log, const F32& dt_bias) {
        expect_shape(b, {-1, -1}, "b");
        expect_shape(a, {b.shape(0), b.shape(1)}, "a");
        expect_shape(A_log, {b.shape(1)}, "A_log");
        expect_shape(dt_bias, {b.shape(1)}, "dt_bias");
        F32 beta = empty_like_shape({b.shape(0), b.shape(1)});
        F32 g = empty_like_shape({b.shape(0), b.shape(1)});
        cpu::gdn_gates(b.data(), b.shape(1), a.data(), a.shape(1), b.shape(0), b.shape(1),
                       A_log.data(), dt_bias.data(), beta.mutable_data(), g.mutable_data());
        return py::make_tuple(beta, g);
      },
      py::arg("b"), py::arg("a"), py::arg("A_log"), py::arg("dt_bias"));
  h.def(
      "delta_rule_recurrent",
      [](const F32& q, const F32& k, const F32& v, const F32& g, const F32& beta,
         const F32& state, bool keep_history, int threads) {
        auto args = delta_rule_args(q, k, v, g, beta, state);
        const auto& d = args.dims;
        F32 history = empty_like_shape(
            {keep_history ? args.tokens : 0, d.value_heads, d.key_dim, d.value_dim});
        const auto range = thread_range(threads);
        cpu::gated_delta_rule_recurrent(d, args.tokens, args.io, args.state.mutable_data(),
                                        keep_history ? history.mutable_data() : nullptr,
                                        threads > 1 ? &range : nullptr);
        return py::make_tuple(args.out, args.state, history);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"), py::arg("beta"), py::arg("state"),
      py::arg("keep_history") = false, py::arg("threads") = 1,
      "q,k [T,Hk,dk] (normalised, q scaled), v [T,Hv,dv], g,beta [T,Hv], state [Hv,dk,dv] -> "
      "(out [T,Hv,dv], new state, per-token states [T or 0,Hv,dk,dv])");
  h.def(
      "delta_rule_chunked",
      [](const F32& q, const F32& k, const F32& v, const F32& g, const F32& beta,
         const F32& state, int64_t chunk_size, int threads) {
        auto args = delta_rule_args(q, k, v, g, beta, state);
        const auto range = thread_range(threads);
        cpu::gated_delta_rule_chunked(args.dims, args.tokens, args.io, args.state.mutable_data(),
                                      chunk_size, threads > 1 ? &range : nullptr);
        return py::make_tuple(args.out, args.state);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"), py::arg("beta"), py::arg("state"),
      py::arg("chunk_size") = 64, py::arg("threads") = 1);
  h.def(
      "gated_rmsnorm",
      [](const F32& x, const F32& z, const F32& weight, float eps) {
        expect_shape(x, {-1, -1}, "x");
        expect_shape(z, {x.shape(0), x.shape(1)}, "z");
        expect_shape(weight, {x.shape(1)}, "weight");
        F32 out = empty_like_shape({x.shape(0), x.shape(1)});
        cpu::gated_rmsnorm(x.data(), z.data(), x.shape(0), x.shape(1), weight.data(), eps,
                           out.mutable_data());
        return out;
      },
      py::arg("x"), py::arg("z"), py::arg("weight"), py::arg("eps") = 1e-6f);
  h.def(
      "gdn_mixer_core",
      [](const F32& mixed, const F32& z, const F32& b, const F32& a, const F32& conv_weight,
         const F32& A_log, const F32& dt_bias, const F32& norm_weight, const F32& conv_state,
         const F32& ssm_state, int64_t key_heads, int64_t key_dim, const std::string& form,
         float eps, int64_t chunk_size, int threads) {
        expect_shape(ssm_state, {-1, key_dim, -1}, "ssm_state");
        cpu::GdnLayerParams p;
        p.dims = {key_heads, ssm_state.shape(0), key_dim, ssm_state.shape(2)};
        p.dims.validate();
        const int64_t tokens = mixed.shape(0), channels = p.dims.conv_channels();
        expect_shape(mixed, {tokens, channels}, "mixed");
        expect_shape(z, {tokens, p.dims.value_width()}, "z");
        expect_shape(b, {tokens, p.dims.value_heads}, "b");
        expect_shape(a, {tokens, p.dims.value_heads}, "a");
        expect_shape(conv_weight, {channels, -1}, "conv_weight");
        expect_shape(conv_state, {conv_weight.shape(1) - 1, channels}, "conv_state");
        expect_shape(A_log, {p.dims.value_heads}, "A_log");
        expect_shape(dt_bias, {p.dims.value_heads}, "dt_bias");
        expect_shape(norm_weight, {p.dims.value_dim}, "norm_weight");
        p.conv_kernel = conv_weight.shape(1);
        p.norm_eps = eps;
        p.chunk_size = chunk_size;
        p.conv_weight = conv_weight.data();
        p.A_log = A_log.data();
        p.dt_bias = dt_bias.data();
        p.norm_weight = norm_weight.data();
        cpu::DeltaRuleForm f = cpu::DeltaRuleForm::Auto;
        if (form == "chunked") f = cpu::DeltaRuleForm::Chunked;
        else if (form == "recurrent") f = cpu::DeltaRuleForm::Recurrent;
        else if (form != "auto")
          throw std::invalid_argument("form must be 'auto', 'chunked' or 'recurrent'");
        F32 work = copy_of(mixed), new_conv = copy_of(conv_state), new_ssm = copy_of(ssm_state);
        F32 out = empty_like_shape({tokens, p.dims.value_width()});
        const auto range = thread_range(threads);
        cpu::gdn_mixer_core(p, tokens, work.mutable_data(), z.data(), b.data(), a.data(),
                            new_conv.mutable_data(), new_ssm.mutable_data(), out.mutable_data(),
                            f, threads > 1 ? &range : nullptr);
        return py::make_tuple(out, new_conv, new_ssm);
      },
      py::arg("mixed"), py::arg("z"), py::arg("b"), py::arg("a"), py::arg("conv_weight"),
      py::arg("A_log"), py::arg("dt_bias"), py::arg("norm_weight"), py::arg("conv_state"),
      py::arg("ssm_state"), py::arg("key_heads"), py::arg("key_dim"), py::arg("form") = "auto",
      py::arg("eps") = 1e-6f, py::arg("chunk_size") = 64, py::arg("threads") = 1,
      "GDN layer between its projections -> (out [T, Hv*dv], conv_state, ssm_state)");
  h.def(
      "gdn_mixer_batch",
      [](const F32& mixed, const F32& z, const F32& b, const F32& a, const F32& conv_weight,
         const F32& A_log, const F32& dt_bias, const F32& norm_weight,
         const std::vector<int64_t>& lengths, const F32& conv_states, const F32& ssm_states,
         int64_t key_heads, int64_t key_dim, float eps, int64_t chunk_size, int threads,
         bool keep_history) {
        const int64_t num = static_cast<int64_t>(lengths.size());
        expect_shape(ssm_states, {num, -1, key_dim, -1}, "ssm_states");
        cpu::GdnLayerParams p;
        p.dims = {key_heads, ssm_states.shape(1), key_dim, ssm_states.shape(3)};
        p.dims.validate();
        const int64_t rows = mixed.shape(0), channels = p.dims.conv_channels();
        expect_shape(mixed, {rows, channels}, "mixed");
        expect_shape(z, {rows, p.dims.value_width()}, "z");
        expect_shape(b, {rows, p.dims.value_heads}, "b");
        expect_shape(a, {rows, p.dims.value_heads}, "a");
        expect_shape(conv_weight, {channels, -1}, "conv_weight");
        expect_shape(conv_states, {num, conv_weight.shape(1) - 1, channels}, "conv_states");
        expect_shape(A_log, {p.dims.value_heads}, "A_log");
        expect_shape(dt_bias, {p.dims.value_heads}, "dt_bias");
        expect_shape(norm_weight, {p.dims.value_dim}, "norm_weight");
        p.conv_kernel = conv_weight.shape(1);
        p.norm_eps = eps;
        p.chunk_size = chunk_size;
        p.conv_weight = conv_weight.data();
        p.A_log = A_log.data();
        p.dt_bias = dt_bias.data();
        p.norm_weight = norm_weight.data();
        F32 work = copy_of(mixed), new_conv = copy_of(conv_states), new_ssm = copy_of(ssm_states);
        F32 out = empty_like_shape({rows, p.dims.value_width()});
        std::vector<cpu::GdnSequence> seqs;
        int64_t row = 0;
        const int64_t conv_floats = (p.conv_kernel - 1) * channels;
        int64_t total = 0;
        for (int64_t n : lengths) total += n;
        if (total != rows) throw std::invalid_argument("lengths do not sum to the rows of mixed");
        const int64_t kept = keep_history ? rows : 0;
        F32 conv_history = empty_like_shape({kept, p.conv_kernel - 1, channels});
        F32 ssm_history =
            empty_like_shape({kept, p.dims.value_heads, p.dims.key_dim, p.dims.value_dim});
        for (int64_t i = 0; i < num; ++i) {
          cpu::GdnSequence seq{row, lengths[i], new_conv.mutable_data() + i * conv_floats,
                               new_ssm.mutable_data() + i * p.dims.state_floats()};
          if (keep_history) {
            seq.conv_history = conv_history.mutable_data() + row * conv_floats;
            seq.ssm_history = ssm_history.mutable_data() + row * p.dims.state_floats();
          }
          seqs.push_back(seq);
          row += lengths[i];
        }
        const auto range = thread_range(threads);
        cpu::gdn_mixer_batch(p, seqs, work.mutable_data(), z.data(), b.data(), a.data(),
                             out.mutable_data(), cpu::DeltaRuleForm::Auto,
                             threads > 1 ? &range : nullptr);
        if (keep_history)
          return py::tuple(py::make_tuple(out, new_conv, new_ssm, conv_history, ssm_history));
        return py::tuple(py::make_tuple(out, new_conv, new_ssm));
      },
      py::arg("mixed"), py::arg("z"), py::arg("b"), py::arg("a"), py::arg("conv_weight"),
      py::arg("A_log"), py::arg("dt_bias"), py::arg("norm_weight"), py::arg("lengths"),
      py::arg("conv_states"), py::arg("ssm_states"), py::arg("key_heads"), py::arg("key_dim"),
      py::arg("eps") = 1e-6f, py::arg("chunk_size") = 64, py::arg("threads") = 1,
      py::arg("keep_history") = false,
      "GDN core for stacked sequences -> (out, conv_states [N,K-1,C], ssm_states [N,Hv,dk,dv]"
      "[, conv_history [T,K-1,C], ssm_history [T,Hv,dk,dv]])");
}

void bind_gated_attention(py::module_& h) {
  h.def(
      "split_query_gate",
      [](const F32& q_proj_out, int64_t heads, int64_t head_dim) {
        expect_shape(q_proj_out, {-1, heads * 2 * head_dim}, "q_proj_out");
        const int64_t tokens = q_proj_out.shape(0);
        F32 query = empty_like_shape({tokens, heads, head_dim});
        F32 gate = empty_like_shape({tokens, heads, head_dim});
        cpu::split_query_gate(q_proj_out.data(), tokens, heads, head_dim, query.mutable_data(),
                              gate.mutable_data());
        return py::make_tuple(query, gate);
      },
      py::arg("q_proj_out"), py::arg("heads"), py::arg("head_dim"));
  h.def(
      "rmsnorm_zero_centered",
      [](const F32& x, const F32& weight, float eps) {
        expect_shape(x, {-1, -1}, "x");
        expect_shape(weight, {x.shape(1)}, "weight");
        F32 out = empty_like_shape({x.shape(0), x.shape(1)});
        cpu::rmsnorm_zero_centered(x.data(), x.shape(1), x.shape(0), x.shape(1), weight.data(),
                                   eps, out.mutable_data(), x.shape(1));
        return out;
      },
      py::arg("x"), py::arg("weight"), py::arg("eps") = 1e-6f);
  h.def(
      "rope_default_inv_freq",
      [](double theta, int64_t rotary_dim) {
        F32 out = empty_like_shape({rotary_dim / 2});
        cpu::rope_default_inv_freq(theta, rotary_dim, out.mutable_data());
        return out;
      },
      py::arg("theta"), py::arg("rotary_dim"));
  h.def(
      "rope_partial_neox",
      [](const F32& x, const I64& positions, const F32& inv_freq, int64_t rotary_dim,
         float attention_scaling) {
        expect_shape(x, {-1, -1, -1}, "x");
        expect_shape(positions, {x.shape(0)}, "positions");
        expect_shape(inv_freq, {rotary_dim / 2}, "inv_freq");
        F32 out = copy_of(x);
        cpu::rope_partial_neox(out.mutable_data(), x.shape(1) * x.shape(2), x.shape(0),
                               x.shape(1), x.shape(2), rotary_dim, positions.data(),
                               inv_freq.data(), attention_scaling);
        return out;
      },
      py::arg("x"), py::arg("positions"), py::arg("inv_freq"), py::arg("rotary_dim"),
      py::arg("attention_scaling") = 1.0f);
  h.def(
      "sigmoid_gate_multiply",
      [](const F32& x, const F32& gate) {
        if (x.size() != gate.size()) throw std::invalid_argument("x and gate sizes differ");
        F32 out = copy_of(x);
        cpu::sigmoid_gate_multiply(out.mutable_data(), gate.data(), x.size());
        return out;
      },
      py::arg("x"), py::arg("gate"));
}

void bind_moe(py::module_& h) {
  h.def(
      "moe_route_softmax_topk",
      [](const F32& logits, int64_t top_k, bool renormalize) {
        expect_shape(logits, {-1, -1}, "logits");
        I32 ids(std::vector<py::ssize_t>{logits.shape(0), top_k});
        F32 weights = empty_like_shape({logits.shape(0), top_k});
        cpu::moe_route_softmax_topk(logits.data(), logits.shape(0), logits.shape(1), top_k,
                                    renormalize, ids.mutable_data(), weights.mutable_data());
        return py::make_tuple(ids, weights);
      },
      py::arg("logits"), py::arg("top_k"), py::arg("renormalize") = true);
  h.def(
      "moe_group_by_expert",
      [](const I32& ids, int64_t experts) {
        expect_shape(ids, {-1, -1}, "expert_ids");
        const auto g = cpu::moe_group_by_expert(ids.data(), ids.shape(0), ids.shape(1), experts);
        return py::make_tuple(g.offsets, g.token, g.slot);
      },
      py::arg("expert_ids"), py::arg("experts"));
  h.def(
      "moe_weighted_scatter_add",
      [](const F32& rows, const I32& token, const F32& weight, const F32& out) {
        expect_shape(rows, {-1, -1}, "rows");
        expect_shape(token, {rows.shape(0)}, "token");
        expect_shape(weight, {rows.shape(0)}, "weight");
        expect_shape(out, {-1, rows.shape(1)}, "out");
        for (py::ssize_t r = 0; r < token.size(); ++r)
          if (token.data()[r] < 0 || token.data()[r] >= out.shape(0))
            throw std::invalid_argument("token index out of range");
        F32 result = copy_of(out);
        cpu::moe_weighted_scatter_add(rows.data(), rows.shape(0), rows.shape(1), token.data(),
                                      weight.data(), result.mutable_data());
        return result;
      },
      py::arg("rows"), py::arg("token"), py::arg("weight"), py::arg("out"));
  h.def(
      "moe_add_gated_shared",
      [](const F32& shared, const F32& gate_logit, const F32& out) {
        expect_shape(shared, {-1, -1}, "shared");
        expect_shape(gate_logit, {shared.shape(0)}, "gate_logit");
        expect_shape(out, {shared.shape(0), shared.shape(1)}, "out");
        F32 result = copy_of(out);
        cpu::moe_add_gated_shared(shared.data(), gate_logit.data(), shared.shape(0),
                                  shared.shape(1), result.mutable_data());
        return result;
      },
      py::arg("shared"), py::arg("gate_logit"), py::arg("out"));
}

void bind_state_slots(py::module_& h) {
  // Views share the slots' memory; py::keep_alive-style ownership comes from the array base.
  const auto view = [](py::object owner, float* data, std::vector<py::ssize_t> shape) {
    return py::array_t<float>(shape, data, owner);
  };
  py::class_<GdnStateSlots>(h, "GdnStateSlots")
      .def(py::init([](int64_t gdn_layers, int64_t conv_kernel, int64_t conv_channels,
                       int64_t value_heads, int64_t key_dim, int64_t value_dim, int lanes) {
             return std::make_unique<GdnStateSlots>(
                 GdnStateShape{gdn_layers, conv_kernel, conv_channels, value_heads, key_dim,
                               value_dim},
                 lanes);
           }),
           py::arg("gdn_layers"), py::arg("conv_kernel"), py::arg("conv_channels"),
           py::arg("value_heads"), py::arg("key_dim"), py::arg("value_dim"), py::arg("lanes"))
      .def_property_readonly("lanes", &GdnStateSlots::lanes)
      .def_property_readonly("bytes_per_lane", &GdnStateSlots::bytes_per_lane)
      .def("conv_state",
           [view](py::object self, int lane, int64_t layer) {
             auto& slots = self.cast<GdnStateSlots&>();
             const auto& s = slots.shape();
             return view(self, slots.conv_state(lane, layer), {s.conv_kernel - 1, s.conv_channels});
           })
      .def("ssm_state",
           [view](py::object self, int lane, int64_t layer) {
             auto& slots = self.cast<GdnStateSlots&>();
             const auto& s = slots.shape();
             return view(self, slots.ssm_state(lane, layer),
                         {s.value_heads, s.key_dim, s.value_dim});
           })
      .def("reset", &GdnStateSlots::reset)
      .def("copy", &GdnStateSlots::copy, py::arg("from_lane"), py::arg("to_lane"))
      .def("save",
           [](const GdnStateSlots& slots, int lane) {
             const auto saved = slots.save(lane);
             F32 out(std::vector<py::ssize_t>{static_cast<py::ssize_t>(saved.size())});
             std::copy(saved.begin(), saved.end(), out.mutable_data());
             return out;
           })
      .def("load", [](GdnStateSlots& slots, int lane, const F32& saved) {
        slots.load(lane, std::span<const float>(saved.data(), saved.size()));
      });
}

}  // namespace

void bind_hybrid_ops(py::module_& m) {
  auto h = m.def_submodule("hybrid", "Qwen3.5/3.6 hybrid-layer CPU kernels (for tests)");
  bind_gdn(h);
  bind_gated_attention(h);
  bind_moe(h);
  bind_state_slots(h);
}

}  // namespace ninfer::bindings
