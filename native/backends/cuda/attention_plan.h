// Work items of the paged attention kernels, built on the host per step (the "plan") and
// uploaded once; every layer of the step reuses them.
#pragma once

#include <cstdint>

namespace ninfer::cuda {

// One query row of the split-KV (decode) kernel.
struct DecodeItem {
  int32_t row;           // row in the step's q/out arrays
  int32_t kv_len;        // keys [0, kv_len) are visible (causal: its position + 1)
  int32_t pages_offset;  // first entry of its slice's page table in the plan's page array
  int32_t pad;
};

// One block of up to kPrefillBlockRows consecutive query rows of one slice (prefill kernel).
struct PrefillItem {
  int32_t row;           // first row in the step's q/out arrays
  int32_t num_rows;      // rows in this block (1..kPrefillBlockRows)
  int32_t first_pos;     // cache position of the first row
  int32_t pages_offset;  // first entry of its slice's page table in the plan's page array
};

inline constexpr int kPrefillBlockRows = 64;

// Geometry of the KV pool as the kernels address it. bf16: element offset of (layer, page,
// K|V) is ((layer * num_pages + page) * 2 + which) * page_elems; a key row is num_kv_heads *
// head_dim. A quantized pool (kv_dtype != 0, cache/kv_format.h) uses byte regions of
// region_bytes at the same index, codes first, then group scales and f32 scales at the offsets.
struct KvLayout {
  const void* base;      // bf16 elements, or the bytes of quantized regions
  int64_t num_pages;
  int64_t page_elems;
  int32_t num_kv_heads;
  int32_t layer;
  int32_t kv_dtype = 0;  // KvDType: 0 bf16, 1 fp8, 2 int8, 3 nvfp4
  int64_t region_bytes = 0;
  int64_t groups_offset = 0;
  int64_t scales_offset = 0;
};

}  // namespace ninfer::cuda
