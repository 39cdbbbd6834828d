// Recursive-descent JSON parser (RFC 8259) for artifact headers.
#include "common/json.h"

#include <charconv>
#include <cmath>
#include <system_error>
#include <string>

namespace ninfer::json {

namespace {

const Value& shared_null() {
  static const Value null_value;
  return null_value;
}

const char* kind_name(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::Null: return "null";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Number: return "number";
    case Value::Kind::String: return "string";
    case Value::Kind::Array: return "array";
    case Value::Kind::Object: return "object";
  }
  return "?";
}

[[noreturn]] void kind_mismatch(const char* expected, Value::Kind actual) {
  throw std::runtime_error(std::string("JSON value is ") + kind_name(actual) + ", expected " +
                           expected);
}

// Deep headers are never legitimate; the limit keeps hostile input from exhausting the stack.
constexpr int kMaxDepth = 256;

}  // namespace

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Value parse_document() {
    skip_whitespace();
    Value value = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) fail("unexpected trailing characters");
    return value;
  }

 private:
  std::string_view text_;
  size_t pos_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw ParseError("JSON parse error at byte " + std::to_string(pos_) + ": " + what);
  }

  // Error messages must stay valid UTF-8 (Python decodes them), so raw bytes are shown in hex.
  static std::string describe(char c) {
    auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7F) return std::string("'") + c + "'";
    static const char* digits = "0123456789abcdef";
    return std::string("byte 0x") + digits[byte >> 4] + digits[byte & 0xF];
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_whitespace() {
    while (!at_end()) {
      char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  void expect_literal(std::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) fail("invalid literal");
    pos_ += literal.size();
  }

  Value parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting too deep");
    if (at_end()) fail("unexpected end of input");
    Value value;
    switch (peek()) {
      case 'n': expect_literal("null"); return value;
      case 't':
        expect_literal("true");
        value.kind_ = Value::Kind::Bool;
        value.bool_ = true;
        return value;
      case 'f':
        expect_literal("false");
        value.kind_ = Value::Kind::Bool;
        return value;
      case '"':
        value.kind_ = Value::Kind::String;
        value.string_ = parse_string();
        return value;
      case '[': return parse_array(depth);
      case '{': return parse_object(depth);
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return parse_number();
        fail("unexpected character " + describe(peek()));
    }
  }

  Value parse_array(int depth) {
    Value value;
    value.kind_ = Value::Kind::Array;
    ++pos_;  // '['
    skip_whitespace();
    if (peek() == ']') {
      ++pos_;
      return value;
    }
    while (true) {
      skip_whitespace();
      value.array_.push_back(parse_value(depth + 1));
      skip_whitespace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return value;
      }
      fail("expected ',' or ']' in array");
    }
  }

  Value parse_object(int depth) {
    Value value;
    value.kind_ = Value::Kind::Object;
    ++pos_;  // '{'
    skip_whitespace();
    if (peek() == '}') {
      ++pos_;
      return value;
    }
    while (true) {
      skip_whitespace();
      if (peek() != '"') fail("expected a string key in object");
      std::string key = parse_string();
      skip_whitespace();
      if (peek() != ':') fail("expected ':' after object key");
      ++pos_;
      skip_whitespace();
      value.object_.emplace_back(std::move(key), parse_value(depth + 1));
      skip_whitespace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return value;
      }
      fail("expected ',' or '}' in object");
    }
  }

  Value parse_number() {
    size_t start = pos_;
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else if (peek() >= '1' && peek() <= '9') {
      while (peek() >= '0' && peek() <= '9') ++pos_;
    } else {
      fail("invalid number");
    }
    if (peek() == '.') {
      ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("expected digits after '.'");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("expected digits in exponent");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    // from_chars is locale-independent, unlike strtod (a host app may set LC_NUMERIC).
    Value value;
    value.kind_ = Value::Kind::Number;
    auto [end, error] = std::from_chars(text_.data() + start, text_.data() + pos_, value.number_);
    if (error == std::errc::result_out_of_range) fail("number out of range");
    if (error != std::errc() || end != text_.data() + pos_) fail("invalid number");
    return value;
  }

  unsigned parse_hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      code <<= 4;
      if (c >= '0' && c <= '9') code |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') code |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') code |= static_cast<unsigned>(c - 'A' + 10);
      else fail("invalid hex digit in \\u escape");
    }
    return code;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  unsigned parse_escaped_codepoint() {
    unsigned cp = parse_hex4();
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (text_.substr(pos_, 2) != "\\u") fail("unpaired high surrogate");
      pos_ += 2;
      unsigned low = parse_hex4();
      if (low < 0xDC00 || low > 0xDFFF) fail("invalid low surrogate");
      return 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    if (cp >= 0xDC00 && cp <= 0xDFFF) fail("unpaired low surrogate");
    return cp;
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (at_end()) fail("unterminated string");
      char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_end()) fail("unterminated escape");
      char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': append_utf8(out, parse_escaped_codepoint()); break;
        default: --pos_; fail("invalid escape character");
      }
    }
  }
};

Value Value::parse(std::string_view text) { return Parser(text).parse_document(); }

bool Value::as_bool() const {
  if (kind_ != Kind::Bool) kind_mismatch("bool", kind_);
  return bool_;
}

double Value::as_double() const {
  if (kind_ != Kind::Number) kind_mismatch("number", kind_);
  return number_;
}

int64_t Value::as_int() const {
  if (kind_ != Kind::Number) kind_mismatch("number", kind_);
  // 2^63 is the first double outside int64's range; the bounds test also rejects NaN.
  if (!(number_ >= -9223372036854775808.0 && number_ < 9223372036854775808.0) ||
      std::trunc(number_) != number_) {
    throw std::runtime_error("JSON number " + std::to_string(number_) + " is not an integer");
  }
  return static_cast<int64_t>(number_);
}

const std::string& Value::as_string() const {
  if (kind_ != Kind::String) kind_mismatch("string", kind_);
  return string_;
}

const std::vector<Value>& Value::as_array() const {
  if (kind_ != Kind::Array) kind_mismatch("array", kind_);
  return array_;
}

const std::vector<std::pair<std::string, Value>>& Value::as_object() const {
  if (kind_ != Kind::Object) kind_mismatch("object", kind_);
  return object_;
}

size_t Value::size() const {
  if (kind_ == Kind::Array) return array_.size();
  if (kind_ == Kind::Object) return object_.size();
  return 0;
}

bool Value::contains(std::string_view key) const {
  if (kind_ != Kind::Object) return false;
  for (const auto& [name, value] : object_) {
    if (name == key) return true;
  }
  return false;
}

const Value& Value::operator[](std::string_view key) const {
  if (kind_ != Kind::Object) return shared_null();
  for (const auto& [name, value] : object_) {
    if (name == key) return value;
  }
  return shared_null();
}

const Value& Value::operator[](size_t index) const {
  const auto& items = as_array();
  if (index >= items.size()) {
    throw std::runtime_error("JSON array index " + std::to_string(index) + " out of range (size " +
                             std::to_string(items.size()) + ")");
  }
  return items[index];
}

int64_t Value::get_int(std::string_view key, int64_t fallback) const {
  const Value& v = (*this)[key];
  return v.is_null() ? fallback : v.as_int();
}

double Value::get_double(std::string_view key, double fallback) const {
  const Value& v = (*this)[key];
  return v.is_null() ? fallback : v.as_double();
}

bool Value::get_bool(std::string_view key, bool fallback) const {
  const Value& v = (*this)[key];
  return v.is_null() ? fallback : v.as_bool();
}

std::string Value::get_string(std::string_view key, std::string_view fallback) const {
  const Value& v = (*this)[key];
  return v.is_null() ? std::string(fallback) : v.as_string();
}

}  // namespace ninfer::json
