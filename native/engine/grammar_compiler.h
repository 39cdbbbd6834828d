// Compiles output constraints (JSON Schema, GBNF, regex, structural tags) against the model's
// vocabulary with xgrammar, and caches the results.
//
// Compilation is the slow part of constrained decoding (a new JSON schema takes ~100 ms on a
// 248k vocabulary), so it happens before admission, on the caller's thread, never on the
// engine worker. Results are cached by (kind, source): the caller passes canonical source
// text, so identical constraints share one entry. Compiles are single-flight: a second
// request for a grammar that is still compiling waits for the first instead of compiling it
// again.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace xgrammar {
class CompiledGrammar;
class GrammarCompiler;
class TokenizerInfo;
}  // namespace xgrammar

namespace ninfer {

enum class GrammarKind : uint8_t {
  JsonSchema,        // source: a JSON Schema document; free-form JSON types follow JSON Schema
  StrictJsonSchema,  // source: a JSON Schema; objects without additionalProperties are closed
  Ebnf,              // source: a GBNF grammar with a `root` rule
  Regex,             // source: a regular expression matched against the whole output
  StructuralTag,     // source: an xgrammar structural-tag JSON document (tool calls)
};

// Parses "json_schema", "strict_json_schema", "ebnf", "regex" or "structural_tag".
GrammarKind grammar_kind_from_name(const std::string& name);
const char* grammar_kind_name(GrammarKind kind);

// The grammar library rejected a constraint's source; what() is the library's reason.
class GrammarError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One compiled constraint, shared (read-only) by every request that uses it.
struct CompiledConstraint {
  GrammarKind kind;
  std::shared_ptr<const xgrammar::CompiledGrammar> grammar;
  double compile_seconds = 0.0;  // time the build took (0 for none yet)
};

enum class CacheResult : uint8_t { Hit, Built, Waited };
const char* cache_result_name(CacheResult result);

struct CompileOutcome {
  std::shared_ptr<const CompiledConstraint> constraint;
  CacheResult cache = CacheResult::Built;
  double seconds = 0.0;  // this call's wall time (compile, wait or lookup)
};

class GrammarCompiler {
 public:
  // `token_bytes[id]` are the bytes of token `id`; ids in `special_ids` and ids past the table
  // (up to `vocab_size`, the model's logit rows) are never produced by a grammar. `stop_ids`
  // are the model's EOS ids: allowed exactly when the grammar can end.
  GrammarCompiler(const std::vector<std::string>& token_bytes, int64_t vocab_size,
                  const std::vector<int32_t>& stop_ids, const std::vector<int32_t>& special_ids,
                  int max_entries = 256);
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  // Thread-safe. Throws GrammarError when the library rejects the source (the failure is
  // cached like a success: the same source fails the same way without recompiling).
  // `lead` is literal text the output must start with before the grammar's language (the
  // line breaks a thinking model writes after `</think>`).
  CompileOutcome compile(GrammarKind kind, const std::string& source, const std::string& lead = {});

  int64_t vocab_size() const { return vocab_size_; }
  // 32-bit words of one packed token bitmask over the model's vocabulary.
  int32_t bitmask_words() const { return static_cast<int32_t>((vocab_size_ + 31) / 32); }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  size_t cached_entries() const;

 private:
  using Result = std::shared_ptr<const CompiledConstraint>;
  std::shared_ptr<const CompiledConstraint> build(GrammarKind kind, const std::string& source,
                                                  const std::string& lead);

  const int64_t vocab_size_;
  const std::vector<int32_t> stop_ids_;
  const int max_entries_;
  std::unique_ptr<xgrammar::TokenizerInfo> tokenizer_;
  std::unique_ptr<xgrammar::GrammarCompiler> compiler_;

  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_future<Result>> entries_;
};

}  // namespace ninfer
