// Python view of output constraints: compiled grammars (handles the engine's submit takes),
// a standalone compiler and matcher for kernel-level tests, and the host mask application.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "engine/constraint_matcher.h"
#include "engine/grammar_compiler.h"

namespace py = pybind11;

namespace ninfer::bindings {

py::dict constraint_stats_dict(const ConstraintStats& s) {
  py::dict d;
  d["complete"] = s.complete;
  d["terminated"] = s.terminated;
  d["cache"] = cache_result_name(s.cache);
  d["mask_positions"] = s.mask_positions;
  d["mask_upload_bytes"] = s.mask_upload_bytes;
  d["prepare_seconds"] = s.prepare_seconds;
  d["mask_seconds"] = s.mask_seconds;
  d["matcher_seconds"] = s.matcher_seconds;
  return d;
}

CompileOutcome compile_grammar(GrammarCompiler& compiler, const std::string& kind, const std::string& source,
                               const std::string& lead) {
  const GrammarKind parsed = grammar_kind_from_name(kind);
  py::gil_scoped_release release;
  return compiler.compile(parsed, source, lead);
}

void bind_grammar(py::module_& m) {
  py::register_exception<GrammarError>(m, "GrammarError", PyExc_ValueError);

  py::class_<CompileOutcome>(m, "CompiledGrammar",
                             "A compiled output constraint, with how this compile request was served.")
      .def_property_readonly("kind", [](const CompileOutcome& o) { return grammar_kind_name(o.constraint->kind); })
      .def_property_readonly("cache", [](const CompileOutcome& o) { return cache_result_name(o.cache); })
      .def_readonly("seconds", &CompileOutcome::seconds)
      .def_property_readonly("compile_seconds", [](const CompileOutcome& o) { return o.constraint->compile_seconds; });

  py::class_<GrammarCompiler>(m, "GrammarCompiler")
      .def(py::init([](const std::vector<py::bytes>& token_bytes, int64_t vocab_size, std::vector<int32_t> stop_ids,
                       std::vector<int32_t> special_ids) {
             std::vector<std::string> bytes(token_bytes.begin(), token_bytes.end());
             py::gil_scoped_release release;
             return std::make_unique<GrammarCompiler>(bytes, vocab_size, stop_ids, special_ids);
           }),
           py::arg("token_bytes"), py::arg("vocab_size"), py::kw_only(), py::arg("stop_ids"),
           py::arg("special_ids") = std::vector<int32_t>{})
      .def("compile", &compile_grammar, py::arg("kind"), py::arg("source"), py::arg("lead") = "",
           "kind: json_schema | strict_json_schema | ebnf | regex | structural_tag; lead: literal text "
           "before the grammar's language. Raises GrammarError.")
      .def_property_readonly("bitmask_words", &GrammarCompiler::bitmask_words)
      .def_property_readonly("cached_entries", &GrammarCompiler::cached_entries);

  py::class_<ConstraintMatcher>(m, "ConstraintMatcher")
      .def(py::init([](const CompileOutcome& grammar, int64_t vocab_size, int32_t start_after,
                       const std::string& prefix) {
             return ConstraintMatcher(grammar.constraint, vocab_size, start_after, prefix);
           }),
           py::arg("grammar"), py::arg("vocab_size"), py::arg("start_after") = -1, py::arg("prefix") = "")
      .def("next_mask",
           [](ConstraintMatcher& self) {
             py::array_t<uint32_t> mask(self.bitmask_words());
             self.fill_next_mask(std::span<uint32_t>(mask.mutable_data(), static_cast<size_t>(mask.size())));
             return mask;
           },
           "The packed bitmask (uint32 words) of the tokens allowed next.")
      .def("accept", &ConstraintMatcher::accept, py::arg("token"))
      .def("rollback", &ConstraintMatcher::rollback, py::arg("tokens"))
      .def_property_readonly("active", &ConstraintMatcher::active)
      .def_property_readonly("complete", &ConstraintMatcher::complete)
      .def_property_readonly("terminated", &ConstraintMatcher::terminated)
      .def("stats", [](const ConstraintMatcher& self) { return constraint_stats_dict(self.settle()); });

  m.def(
      "apply_token_bitmask",
      [](py::array_t<float, py::array::c_style> logits, py::array_t<uint32_t, py::array::c_style> bitmask) {
        if (logits.ndim() != 1 || bitmask.ndim() != 1) throw py::value_error("logits and bitmask must be 1-D");
        apply_token_bitmask(std::span<float>(logits.mutable_data(), static_cast<size_t>(logits.size())),
                            std::span<const uint32_t>(bitmask.data(), static_cast<size_t>(bitmask.size())));
      },
      py::arg("logits"), py::arg("bitmask"), "Masks disallowed logits to -inf in place (host sampler path).");
}

}  // namespace ninfer::bindings
