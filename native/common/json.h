// A small JSON value and parser for artifact headers (read-only use, no dependencies).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ninfer::json {

class ParseError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Value {
 public:
  enum class Kind : uint8_t { Null, Bool, Number, String, Array, Object };

  Value() = default;
  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::Null; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_number() const { return kind_ == Kind::Number; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }

  // Typed accessors throw std::runtime_error naming the expected kind on mismatch.
  bool as_bool() const;
  double as_double() const;
  int64_t as_int() const;  // the number must be integral
  const std::string& as_string() const;
  const std::vector<Value>& as_array() const;
  // Members in document order.
  const std::vector<std::pair<std::string, Value>>& as_object() const;

  size_t size() const;  // array length or member count; 0 otherwise
  bool contains(std::string_view key) const;
  // Object member lookup; returns a shared null Value when absent or when this is no object.
  const Value& operator[](std::string_view key) const;
  const Value& operator[](size_t index) const;  // throws when out of range

  // Convenience getters with a default when the member is absent or null.
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_double(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::string get_string(std::string_view key, std::string_view fallback) const;

  static Value parse(std::string_view text);  // throws ParseError with the byte offset

 private:
  friend class Parser;
  Kind kind_ = Kind::Null;
  bool bool_ = false;
  double number_ = 0.0;
  std::string string_;
  std::vector<Value> array_;
  std::vector<std::pair<std::string, Value>> object_;
};

}  // namespace ninfer::json
