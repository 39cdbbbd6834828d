// Reader of .ninfer artifacts: maps the file and hands out zero-copy tensor views.
//
// File layout (version 1; docs/artifact-format.md is the reference):
//   offset 0   8 bytes  magic kArtifactMagic ("NINFER" 0x1A 0x0A)
//   offset 8   u32 LE   format version
//   offset 12  u32 LE   reserved (0)
//   offset 16  u64 LE   header length in bytes (JSON, UTF-8)
//   offset 24  u32 LE   CRC-32 of the header bytes
//   offset 28  u32 LE   reserved (0)
//   offset 32  header JSON
//   then zero padding up to data_offset = align_up(32 + header_len, 256)
//   data section: tensors and resources at header-given offsets (relative to data_offset,
//   each 256-byte aligned); its total size is header["data_size"].
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/dtype.h"
#include "common/json.h"

namespace ninfer {

inline constexpr char kArtifactMagic[8] = {'N', 'I', 'N', 'F', 'E', 'R', '\x1a', '\n'};
inline constexpr uint32_t kArtifactVersion = 1;
inline constexpr uint64_t kArtifactAlignment = 256;

// Raised for any file that cannot be used; the message names the file and the problem.
class ArtifactError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // logical element shape (row-major; last axis contiguous)
  uint64_t nbytes = 0;
  const void* data = nullptr;  // points into the mapping; valid while the Artifact lives
  // Rows of one matrix of the tensor as stored (shape[-2]; a stacked [E, N, K] tensor: N).
  // Kept when a model views the tensor with other leading axes: FP8 block scales restart at
  // every matrix.
  int64_t group_rows = 1;

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

class Artifact {
 public:
  // Maps `path`; throws ArtifactError on a missing/short file, bad magic, unknown version,
  // header CRC mismatch, malformed header JSON, or a tensor/resource outside the data section.
  static std::unique_ptr<Artifact> open(const std::string& path);
  ~Artifact();
  Artifact(const Artifact&) = delete;
  Artifact& operator=(const Artifact&) = delete;

  const std::string& path() const { return path_; }
  const json::Value& header() const { return header_; }
  std::string_view header_json() const { return header_text_; }  // the raw header bytes
  const json::Value& config() const { return header_["config"]; }
  std::string architecture() const { return header_["architecture"].as_string(); }
  uint64_t file_size() const { return size_; }

  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find(std::string_view name) const;
  const TensorView& tensor(std::string_view name) const;  // throws ArtifactError if absent
  bool has_resource(std::string_view name) const;
  std::string_view resource(std::string_view name) const;  // throws ArtifactError if absent
  std::vector<std::string> resource_names() const;         // in header order

 private:
  Artifact() = default;
  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  std::string_view header_text_;  // points into the mapping
  json::Value header_;
  std::vector<TensorView> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
  std::unordered_map<std::string, std::string_view> resources_;
};

}  // namespace ninfer
