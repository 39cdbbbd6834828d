#include "engine/grammar_compiler.h"

#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <variant>

namespace ninfer {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The grammar vocabulary: the byte table, with special ids blanked (xgrammar treats an empty
// token as special: never allowed, except stop ids when the grammar may end).
std::vector<std::string> grammar_vocabulary(const std::vector<std::string>& token_bytes, int64_t vocab_size,
                                            const std::vector<int32_t>& special_ids) {
  std::vector<std::string> vocab(token_bytes.begin(),
                                 token_bytes.begin() + std::min<int64_t>(vocab_size, token_bytes.size()));
  for (int32_t id : special_ids)
    if (id >= 0 && id < static_cast<int64_t>(vocab.size())) vocab[static_cast<size_t>(id)].clear();
  return vocab;
}

// `text` as an EBNF string literal.
std::string ebnf_literal(const std::string& text) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7F) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

GrammarKind grammar_kind_from_name(const std::string& name) {
  if (name == "json_schema") return GrammarKind::JsonSchema;
  if (name == "strict_json_schema") return GrammarKind::StrictJsonSchema;
  if (name == "ebnf") return GrammarKind::Ebnf;
  if (name == "regex") return GrammarKind::Regex;
  if (name == "structural_tag") return GrammarKind::StructuralTag;
  throw std::invalid_argument("unknown grammar kind '" + name + "'");
}

const char* grammar_kind_name(GrammarKind kind) {
  switch (kind) {
    case GrammarKind::JsonSchema: return "json_schema";
    case GrammarKind::StrictJsonSchema: return "strict_json_schema";
    case GrammarKind::Ebnf: return "ebnf";
    case GrammarKind::Regex: return "regex";
    case GrammarKind::StructuralTag: return "structural_tag";
  }
  return "unknown";
}

const char* cache_result_name(CacheResult result) {
  switch (result) {
    case CacheResult::Hit: return "hit";
    case CacheResult::Built: return "built";
    case CacheResult::Waited: return "waited";
  }
  return "unknown";
}

GrammarCompiler::GrammarCompiler(const std::vector<std::string>& token_bytes, int64_t vocab_size,
                                 const std::vector<int32_t>& stop_ids, const std::vector<int32_t>& special_ids,
                                 int max_entries)
    : vocab_size_(vocab_size), stop_ids_(stop_ids), max_entries_(std::max(1, max_entries)) {
  if (vocab_size < 1) throw std::invalid_argument("the grammar vocabulary is empty");
  if (static_cast<int64_t>(token_bytes.size()) > vocab_size)
    throw std::invalid_argument("the token byte table has more entries than the model has logit rows");
  for (int32_t id : stop_ids)
    if (id < 0 || id >= vocab_size) throw std::invalid_argument("a stop id lies outside the vocabulary");
  tokenizer_ = std::make_unique<xgrammar::TokenizerInfo>(grammar_vocabulary(token_bytes, vocab_size, special_ids),
                                                         xgrammar::VocabType::RAW, static_cast<int>(vocab_size),
                                                         std::vector<int32_t>(stop_ids), false);
  const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  // Our own cache (below) keys and single-flights compiles; the library's would hold a second copy.
  compiler_ = std::make_unique<xgrammar::GrammarCompiler>(*tokenizer_, threads, /*cache_enabled=*/false);
}

GrammarCompiler::~GrammarCompiler() = default;

size_t GrammarCompiler::cached_entries() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

std::shared_ptr<const CompiledConstraint> GrammarCompiler::build(GrammarKind kind, const std::string& source,
                                                                 const std::string& lead) {
  const auto start = std::chrono::steady_clock::now();
  // With a lead the grammar is built first and prefixed, then compiled as one.
  auto grammar = [&]() -> xgrammar::Grammar {
    switch (kind) {
      case GrammarKind::JsonSchema:
      case GrammarKind::StrictJsonSchema:
        return xgrammar::Grammar::FromJSONSchema(source, /*any_whitespace=*/false, std::nullopt,
                                                 std::make_pair(std::string(","), std::string(":")),
                                                 /*strict_mode=*/kind == GrammarKind::StrictJsonSchema);
      case GrammarKind::Ebnf: return xgrammar::Grammar::FromEBNF(source, "root");
      case GrammarKind::Regex: return xgrammar::Grammar::FromRegex(source);
      case GrammarKind::StructuralTag: {
        auto parsed = xgrammar::Grammar::FromStructuralTag(source, *tokenizer_);
        if (auto* error = std::get_if<xgrammar::StructuralTagError>(&parsed))
          throw GrammarError(std::visit([](const auto& e) { return std::string(e.what()); }, *error));
        return std::get<xgrammar::Grammar>(std::move(parsed));
      }
    }
    throw GrammarError("unknown grammar kind");
  };
  auto compiled = [&]() -> xgrammar::CompiledGrammar {
    try {
      if (!lead.empty()) {
        auto prefix = xgrammar::Grammar::FromEBNF("root ::= " + ebnf_literal(lead), "root");
        return compiler_->CompileGrammar(xgrammar::Grammar::Concat({prefix, grammar()}));
      }
      switch (kind) {
        case GrammarKind::JsonSchema:
        case GrammarKind::StrictJsonSchema:
          // Compact separators, no free whitespace: the output is the canonical compact form.
          return compiler_->CompileJSONSchema(source, /*any_whitespace=*/false, std::nullopt,
                                              std::make_pair(std::string(","), std::string(":")),
                                              /*strict_mode=*/kind == GrammarKind::StrictJsonSchema);
        case GrammarKind::Ebnf: return compiler_->CompileGrammar(source, "root");
        case GrammarKind::Regex: return compiler_->CompileRegex(source);
        case GrammarKind::StructuralTag: return compiler_->CompileStructuralTag(source);
      }
    } catch (const GrammarError&) {
      throw;
    } catch (const std::exception& e) {
      throw GrammarError(e.what());
    }
    throw GrammarError("unknown grammar kind");
  }();
  auto constraint = std::make_shared<CompiledConstraint>();
  constraint->kind = kind;
  constraint->grammar = std::make_shared<const xgrammar::CompiledGrammar>(std::move(compiled));
  constraint->compile_seconds = seconds_since(start);
  return constraint;
}

CompileOutcome GrammarCompiler::compile(GrammarKind kind, const std::string& source, const std::string& lead) {
  const auto start = std::chrono::steady_clock::now();
  // kind, the lead's length and bytes, then the source: distinct inputs, distinct keys.
  std::string key(1, static_cast<char>(kind));
  key += std::to_string(lead.size()) + ':' + lead;
  key += source;
  CompileOutcome outcome;
  std::shared_future<Result> pending;
  std::promise<Result> promise;
  {
    std::lock_guard lock(mu_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      pending = it->second;
      const bool ready = pending.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
      outcome.cache = ready ? CacheResult::Hit : CacheResult::Waited;
    } else {
      if (static_cast<int>(entries_.size()) >= max_entries_) {
        // Bounded memory: drop finished entries (compiles in flight keep their waiters).
        std::erase_if(entries_, [](const auto& entry) {
          return entry.second.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
        });
      }
      pending = promise.get_future().share();
      entries_.emplace(key, pending);
      outcome.cache = CacheResult::Built;
    }
  }
  if (outcome.cache == CacheResult::Built) {
    try {
      promise.set_value(build(kind, source, lead));
    } catch (...) {
      promise.set_exception(std::current_exception());
    }
  }
  outcome.constraint = pending.get();  // rethrows the build's GrammarError
  outcome.seconds = seconds_since(start);
  return outcome;
}

}  // namespace ninfer
