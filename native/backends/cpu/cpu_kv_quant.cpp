// Quantized KV pages on the CPU (the reference implementation of --kv-dtype fp8|int8|nvfp4):
// rows are quantized per token-head as they are written and dequantized per page when
// attention reads them (cache/kv_format.h has the formats and the region layout).
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "cache/kv_pool.h"

namespace ninfer::cpu {

namespace {

struct RegionPointers {
  uint8_t* codes;
  uint8_t* groups;
  float* scales;
};

RegionPointers region_at(KvPool& kv, int64_t layer, int32_t page, int which) {
  const KvRegion r = kv.region();
  auto* base = static_cast<uint8_t*>(kv.storage().memory.get()) + kv.region_offset(layer, page, which, sizeof(float));
  return {base, base + r.groups_offset, reinterpret_cast<float*>(base + r.scales_offset)};
}

}  // namespace

void CpuBackend::kv_write_quantized(KvPool& kv, int64_t layer, const float* k, const float* v,
                                    std::span<const AttentionSlice> slices) {
  const KvRegion r = kv.region();
  const int64_t hd = kv.head_dim(), nkv = kv.num_kv_heads(), row = nkv * hd;
  for (const auto& s : slices)
    for (int32_t i = 0; i < s.num_tokens; ++i) {
      const int64_t pos = static_cast<int64_t>(s.start_pos) + i;
      const int32_t page = s.page_table[pos / kPageTokens];
      const int64_t slot = pos % kPageTokens;
      const int64_t src = (static_cast<int64_t>(s.row_begin) + i) * row;
      for (int which = 0; which < 2; ++which) {
        const RegionPointers at = region_at(kv, layer, page, which);
        const float* x = (which == 0 ? k : v) + src;
        for (int64_t h = 0; h < nkv; ++h) {
          const int64_t index = slot * nkv + h;  // token-head row within the region
          kvcodec::quantize_row(kv.kv_dtype(), x + h * hd, hd, at.codes + index * r.code_bytes,
                                at.groups + index * r.group_bytes, at.scales + index);
        }
      }
    }
}

const float* dequantize_page_rows(KvPool& kv, int64_t layer, int32_t page, int which, int64_t kv_head, int64_t count,
                                  std::vector<float>& rows) {
  const KvRegion r = kv.region();
  const int64_t hd = kv.head_dim(), nkv = kv.num_kv_heads();
  rows.resize(static_cast<size_t>(kPageTokens * hd));
  const RegionPointers at = region_at(kv, layer, page, which);
  for (int64_t t = 0; t < count; ++t) {
    const int64_t index = t * nkv + kv_head;
    kvcodec::dequantize_row(kv.kv_dtype(), at.codes + index * r.code_bytes, at.groups + index * r.group_bytes,
                            at.scales[index], hd, rows.data() + t * hd);
  }
  return rows.data();
}

}  // namespace ninfer::cpu
