// .ninfer reader: maps the file read-only, checks every structural promise of the header, and
// builds zero-copy tensor views into the mapping.
#include "artifact/artifact.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <limits>

namespace ninfer {

namespace {

constexpr uint64_t kPreambleSize = 32;

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

// CRC-32 as zlib/PNG compute it (reflected polynomial 0xEDB88320), so Python's zlib.crc32 agrees.
uint32_t crc32(const uint8_t* data, uint64_t size) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  uint32_t c = 0xFFFFFFFFu;
  for (uint64_t i = 0; i < size; ++i) c = table[(c ^ data[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

uint64_t load_u64(const uint8_t* p) { return uint64_t(load_u32(p)) | uint64_t(load_u32(p + 4)) << 32; }

uint64_t align_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// Owns the mapping until the Artifact takes it, so every early throw unmaps.
struct Mapping {
  const uint8_t* base = nullptr;
  uint64_t size = 0;
  ~Mapping() {
    if (base != nullptr) munmap(const_cast<uint8_t*>(base), size);
  }
};

class Validator {
 public:
  explicit Validator(const std::string& path) : path_(path) {}

  [[noreturn]] void fail(const std::string& problem) const {
    throw ArtifactError("artifact '" + path_ + "': " + problem);
  }

  uint64_t non_negative(const json::Value& v, const std::string& what) const {
    if (!v.is_number()) fail(what + " must be a number");
    int64_t n = 0;
    try {
      n = v.as_int();
    } catch (const std::runtime_error&) {
      fail(what + " must be an integer");
    }
    if (n < 0) fail(what + " must not be negative");
    return static_cast<uint64_t>(n);
  }

  // Checks that [offset, offset + size) lies inside the data section and returns the offset.
  uint64_t extent(const json::Value& entry, const char* size_key, uint64_t data_size,
                  const std::string& what) const {
    uint64_t offset = non_negative(entry["offset"], what + " offset");
    uint64_t size = non_negative(entry[size_key], what + " " + size_key);
    if (offset > data_size || size > data_size - offset) {
      fail(what + " [" + std::to_string(offset) + ", +" + std::to_string(size) +
           ") lies outside the data section of " + std::to_string(data_size) + " bytes");
    }
    return offset;
  }

 private:
  const std::string& path_;
};

uint64_t expected_nbytes(const Validator& check, const std::string& name, DType dtype,
                         const std::vector<int64_t>& shape) {
  if (shape.empty()) check.fail("tensor '" + name + "' has an empty shape");
  uint64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) {
    uint64_t d = static_cast<uint64_t>(shape[i]);
    if (d != 0 && rows > std::numeric_limits<uint64_t>::max() / 2 / d) {
      check.fail("tensor '" + name + "' shape is too large");
    }
    rows *= d;
  }
  int64_t cols = shape.back();
  if (is_block_quantized(dtype)) {
    if (shape.size() < 2) check.fail("tensor '" + name + "' is " + std::string(dtype_name(dtype)) + " but not a matrix");
    if (const std::string problem = quantized_shape_problem(dtype, cols); !problem.empty())
      check.fail("tensor '" + name + "': " + problem);
    if (rows > (uint64_t(1) << 40) || cols > (int64_t(1) << 24)) check.fail("tensor '" + name + "' shape is too large");
    const int64_t group_rows = shape[shape.size() - 2];
    return static_cast<uint64_t>(
        QuantizedLayout::of(dtype, static_cast<int64_t>(rows), cols, group_rows).nbytes);
  }
  if (dtype == DType::Q8_0 && cols % kQ8BlockSize != 0) {
    check.fail("tensor '" + name + "' is q8_0 but its last dimension " + std::to_string(cols) +
               " is not a multiple of " + std::to_string(kQ8BlockSize));
  }
  uint64_t per_row = static_cast<uint64_t>(row_bytes(dtype, cols));
  if (per_row != 0 && rows > std::numeric_limits<uint64_t>::max() / 2 / per_row) {
    check.fail("tensor '" + name + "' shape is too large");
  }
  return rows * per_row;
}

}  // namespace

std::unique_ptr<Artifact> Artifact::open(const std::string& path) {
  Validator check(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) check.fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    check.fail(std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    check.fail("not a regular file");
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kPreambleSize) {
    ::close(fd);
    check.fail("file too short (" + std::to_string(size) + " bytes) for the " +
               std::to_string(kPreambleSize) + "-byte preamble");
  }
  void* addr = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);  // the mapping stays valid without the descriptor
  if (addr == MAP_FAILED) check.fail(std::string("cannot map: ") + std::strerror(map_err));
  Mapping mapping{static_cast<const uint8_t*>(addr), size};
  const uint8_t* base = mapping.base;

  if (std::memcmp(base, kArtifactMagic, sizeof(kArtifactMagic)) != 0) {
    check.fail("wrong magic: not a .ninfer artifact");
  }
  uint32_t version = load_u32(base + 8);
  if (version != kArtifactVersion) {
    check.fail("unknown format version " + std::to_string(version) + " (this reader knows " +
               std::to_string(kArtifactVersion) + ")");
  }
  uint64_t header_len = load_u64(base + 16);
  if (header_len > size - kPreambleSize) {
    check.fail("file too short: header of " + std::to_string(header_len) +
               " bytes extends past the end of the " + std::to_string(size) + "-byte file");
  }
  const uint8_t* header_bytes = base + kPreambleSize;
  uint32_t stored_crc = load_u32(base + 24);
  uint32_t actual_crc = crc32(header_bytes, header_len);
  if (stored_crc != actual_crc) {
    check.fail("header CRC-32 mismatch (stored " + std::to_string(stored_crc) + ", computed " +
               std::to_string(actual_crc) + "): the header is corrupted");
  }

  auto artifact = std::unique_ptr<Artifact>(new Artifact());
  artifact->path_ = path;
  artifact->header_text_ =
      std::string_view(reinterpret_cast<const char*>(header_bytes), header_len);
  try {
    artifact->header_ = json::Value::parse(artifact->header_text_);
  } catch (const json::ParseError& e) {
    check.fail(std::string("malformed header JSON: ") + e.what());
  }
  const json::Value& header = artifact->header_;
  if (!header.is_object()) check.fail("header JSON is not an object");
  if (header["format_version"].is_number() &&
      check.non_negative(header["format_version"], "format_version") != kArtifactVersion) {
    check.fail("header format_version disagrees with the preamble version");
  }
  if (!header["architecture"].is_string()) check.fail("header lacks a string 'architecture'");
  if (!header["config"].is_object()) check.fail("header lacks a 'config' object");

  uint64_t data_offset = align_up(kPreambleSize + header_len, kArtifactAlignment);
  uint64_t data_size = check.non_negative(header["data_size"], "data_size");
  if (data_offset > size || data_size > size - data_offset) {
    check.fail("file too short: data section needs " + std::to_string(data_offset + data_size) +
               " bytes, the file has " + std::to_string(size) + " (truncated?)");
  }
  const uint8_t* data = base + data_offset;

  const json::Value& tensors = header["tensors"];
  if (!tensors.is_object()) check.fail("header lacks a 'tensors' object");
  artifact->tensors_.reserve(tensors.size());
  for (const auto& [name, entry] : tensors.as_object()) {
    std::string what = "tensor '" + name + "'";
    if (!entry.is_object()) check.fail(what + " entry is not an object");
    if (!entry["dtype"].is_string()) check.fail(what + " lacks a string dtype");
    TensorView view;
    view.name = name;
    try {
      view.dtype = dtype_from_name(entry["dtype"].as_string());
    } catch (const std::runtime_error& e) {
      check.fail(what + ": " + e.what());
    }
    if (!entry["shape"].is_array()) check.fail(what + " lacks a shape array");
    for (const auto& dim : entry["shape"].as_array()) {
      uint64_t d = check.non_negative(dim, what + " shape dimension");
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / 2)) {
        check.fail(what + " shape dimension is too large");
      }
      view.shape.push_back(static_cast<int64_t>(d));
    }
    uint64_t offset = check.extent(entry, "nbytes", data_size, what);
    if (offset % kArtifactAlignment != 0) {
      check.fail(what + " offset " + std::to_string(offset) + " is not " +
                 std::to_string(kArtifactAlignment) + "-byte aligned");
    }
    view.nbytes = check.non_negative(entry["nbytes"], what + " nbytes");
    uint64_t expected = expected_nbytes(check, name, view.dtype, view.shape);
    if (view.nbytes != expected) {
      check.fail(what + " has nbytes " + std::to_string(view.nbytes) + " but its shape and dtype " +
                 std::string(dtype_name(view.dtype)) + " need " + std::to_string(expected));
    }
    view.data = data + offset;
    view.group_rows = view.shape.size() >= 2 ? view.shape[view.shape.size() - 2] : 1;
    if (!artifact->tensor_index_.emplace(name, artifact->tensors_.size()).second) {
      check.fail(what + " appears twice");
    }
    artifact->tensors_.push_back(std::move(view));
  }

  const json::Value& resources = header["resources"];
  if (!resources.is_null()) {
    if (!resources.is_object()) check.fail("header 'resources' is not an object");
    for (const auto& [name, entry] : resources.as_object()) {
      std::string what = "resource '" + name + "'";
      if (!entry.is_object()) check.fail(what + " entry is not an object");
      uint64_t offset = check.extent(entry, "size", data_size, what);
      uint64_t length = check.non_negative(entry["size"], what + " size");
      artifact->resources_[name] =
          std::string_view(reinterpret_cast<const char*>(data + offset), length);
    }
  }

  artifact->base_ = mapping.base;
  artifact->size_ = mapping.size;
  mapping.base = nullptr;  // ownership moves to the artifact
  return artifact;
}

Artifact::~Artifact() {
  if (base_ != nullptr) munmap(const_cast<uint8_t*>(base_), size_);
}

const TensorView* Artifact::find(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorView& Artifact::tensor(std::string_view name) const {
  const TensorView* view = find(name);
  if (view == nullptr) {
    throw ArtifactError("artifact '" + path_ + "': no tensor named '" + std::string(name) + "'");
  }
  return *view;
}

bool Artifact::has_resource(std::string_view name) const {
  return resources_.count(std::string(name)) != 0;
}

std::string_view Artifact::resource(std::string_view name) const {
  auto it = resources_.find(std::string(name));
  if (it == resources_.end()) {
    throw ArtifactError("artifact '" + path_ + "': no resource named '" + std::string(name) + "'");
  }
  return it->second;
}

std::vector<std::string> Artifact::resource_names() const {
  std::vector<std::string> names;
  const json::Value& resources = header_["resources"];
  if (!resources.is_object()) return names;
  for (const auto& member : resources.as_object()) names.push_back(member.first);
  return names;
}

}  // namespace ninfer
