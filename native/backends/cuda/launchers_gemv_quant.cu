// Launchers of the FP8/NVFP4 weight kernels (see launchers_quant.h).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <stdexcept>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels_gemv_quant.cuh"
#include "backends/cuda/kernels_gemv_quant_staged.cuh"
#include "backends/cuda/kernels_gemv_quant_ring.cuh"
#include "backends/cuda/launch_overlapped.h"
#include "backends/cuda/launchers_gemv_quant_sectors.h"
#include "backends/cuda/launchers_quant.h"
#include "common/dtype.h"

namespace ninfer::cuda {

namespace {

int sm_count() {
  int device = 0, sms = 0;
  NINFER_CUDA_CHECK(cudaGetDevice(&device));
  NINFER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

template <bool kNvfp4, int kRowTiles, int kWarps, bool kPipelined>
void launch_tiles(const kernels::QuantGemvTable& table, const float* x, int m, int k, bool overlap,
                  cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(table.first_tile[table.num_jobs])), block(32 * kWarps);
  if (m > 8)
    launch_overlapped(overlap, grid, block, 0, stream,
                      kernels::gemv_quant_block_split<kNvfp4, kRowTiles, kWarps, true, kPipelined>, table, x, m, k);
  else
    launch_overlapped(overlap, grid, block, 0, stream,
                      kernels::gemv_quant_block_split<kNvfp4, kRowTiles, kWarps, false, kPipelined>, table, x, m, k);
}

// The staged kernel (kernels_gemv_quant_staged.cuh) for m <= 8 when x fits its shared memory
// beside the partial sums (48 KB a block without an opt-in, so blocks stay several per SM).
constexpr size_t kStagedMaxBytes = 44 * 1024;

bool staged_fits(int m, int k) { return m <= 8 && kernels::staged_x_bytes(m, k) <= kStagedMaxBytes; }

template <bool kNvfp4, int kRowTiles>
void launch_staged(const kernels::QuantGemvTable& table, const float* x, int m, int k, bool overlap,
                   cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(table.first_tile[table.num_jobs])), block(32 * 4);
  launch_overlapped(overlap, grid, block, kernels::staged_x_bytes(m, k), stream,
                    kernels::gemv_quant_staged<kNvfp4, kRowTiles, 4>, table, x, m, k);
}

// The ring kernel (kernels_gemv_quant_ring.cuh). Its copies need 16-byte aligned rows and,
// for NVFP4, group-scale rows of a multiple of 16 bytes (k % 256 == 0).
constexpr int kRingFirstVariant = 16, kRingVariants = 6;
constexpr int kRingMinSlots = 3, kRingSlots = 4;
// x staged beyond this: one block per SM, given as many slots as the rest of shared memory takes.
constexpr size_t kRingSharedXBytes = 48 * 1024;

bool ring_fits(bool nvfp4, const QuantGemvJob* jobs, int num_jobs, int k) {
  if (nvfp4 && k % 256 != 0) return false;
  for (int j = 0; j < num_jobs; ++j) {
    if (reinterpret_cast<uintptr_t>(jobs[j].codes) % 16 != 0) return false;
    if (nvfp4 && reinterpret_cast<uintptr_t>(jobs[j].scales) % 16 != 0) return false;
  }
  return true;
}

int current_device() {
  int device = 0;
  NINFER_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

int max_shared_per_block() {
  int bytes = 0;
  NINFER_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, current_device()));
  return bytes;
}

// The ring's slots for x staged (x_bytes > 0) or not, or 0 where fewer than kRingMinSlots fit.
template <bool kNvfp4, int kRowTiles>
int ring_slots(size_t x_bytes) {
  using S = kernels::RingShape<kNvfp4, kRowTiles>;
  const size_t room = static_cast<size_t>(max_shared_per_block());
  const size_t fixed = S::kHeadBytes + x_bytes;
  if (fixed + kRingMinSlots * S::kStageBytes > room) return 0;
  if (x_bytes <= kRingSharedXBytes) return kRingSlots;
  return static_cast<int>(std::min<size_t>(S::kMaxSlots, (room - fixed) / S::kStageBytes));
}

int ring_slots_for(bool nvfp4, int rt, size_t x_bytes) {
  if (nvfp4) return rt == 0 ? ring_slots<true, 1>(x_bytes) : rt == 1 ? ring_slots<true, 2>(x_bytes) : ring_slots<true, 4>(x_bytes);
  return rt == 0 ? ring_slots<false, 1>(x_bytes) : rt == 1 ? ring_slots<false, 2>(x_bytes) : ring_slots<false, 4>(x_bytes);
}

bool ring_stages_x(bool nvfp4, int rt, int m, int k) {
  return ring_slots_for(nvfp4, rt, kernels::staged_x_bytes(m, k)) > 0;
}

template <bool kNvfp4, int kRowTiles, bool kStagedX, bool kWide>
void launch_ring_kernel(const kernels::QuantGemvTable& table, const float* x, int m, int k, bool overlap,
                        cudaStream_t stream) {
  auto* kernel = kernels::gemv_quant_ring<kNvfp4, kRowTiles, kStagedX, kWide>;
  const int device = current_device();
  // Above 48 KB a kernel needs the opt-in, once per device (a bit per device).
  static std::atomic<uint64_t> opted_in{0};
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (!bit || !(opted_in.load(std::memory_order_acquire) & bit)) {
    NINFER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared_per_block()));
    // All of the unified L1 as shared memory, so that the blocks the occupancy count promises
    // fit (left to itself the driver may pick a smaller carveout: one block an SM).
    NINFER_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    opted_in.fetch_or(bit, std::memory_order_acq_rel);
  }
  const size_t x_bytes = kStagedX ? kernels::staged_x_bytes(m, k) : 0;
  const int slots = ring_slots<kNvfp4, kRowTiles>(x_bytes);
  if (slots == 0) throw std::invalid_argument("launch_gemv_quant: x does not fit the ring kernel's shared memory");
  const size_t smem = kernels::ring_smem_bytes<kNvfp4, kRowTiles>(slots, x_bytes);
  using S = kernels::RingShape<kNvfp4, kRowTiles>;
  int per_sm = 0;
  NINFER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, S::kThreads, smem));
  // Persistent: as many blocks as the SMs hold at once (each loops over its tiles).
  const int tiles = table.first_tile[table.num_jobs];
  const dim3 grid(static_cast<unsigned int>(std::max(1, std::min(tiles, std::max(1, per_sm) * sm_count()))));
  if (const char* debug = std::getenv("NINFER_QUANT_GEMV_DEBUG"); debug && *debug == '1') {
    static std::atomic<size_t> last{0};
    if (last.exchange(smem) != smem)
      std::fprintf(stderr, "gemv_quant_ring rows %d x%d wide %d m %d k %d: smem %zu, %d slots, %d blocks/SM, grid %u\n",
                   S::kTileRows, kStagedX ? 1 : 0, kWide ? 1 : 0, m, k, smem, slots, per_sm, grid.x);
  }
  launch_overlapped(overlap, grid, dim3(S::kThreads), smem, stream, kernel, table, x, m, k, slots);
}

template <bool kNvfp4, int kRowTiles>
void launch_ring(const kernels::QuantGemvTable& table, const float* x, int m, int k, bool staged_x, bool overlap,
                 cudaStream_t stream) {
  if (staged_x && m > 8)
    launch_ring_kernel<kNvfp4, kRowTiles, true, true>(table, x, m, k, overlap, stream);
  else if (staged_x)
    launch_ring_kernel<kNvfp4, kRowTiles, true, false>(table, x, m, k, overlap, stream);
  else if (m > 8)
    launch_ring_kernel<kNvfp4, kRowTiles, false, true>(table, x, m, k, overlap, stream);
  else
    launch_ring_kernel<kNvfp4, kRowTiles, false, false>(table, x, m, k, overlap, stream);
}

// The ring form the launcher takes by default (variant 0), or -1 for the older kernels.
// NINFER_QUANT_GEMV_VARIANT=N (read at each launch, so a benchmark can switch) forces variant
// N wherever it applies.
int default_ring_variant(bool nvfp4, const QuantGemvJob* jobs, int num_jobs, int m, int k, int64_t rows16) {
  // Measured on the H200 (bench/RESULTS.md, 2026-12-02): at m <= 8 the register-loading
  // kernels match or beat the ring kernel, which reads at most ~57 % of the copy rate with
  // 10+ MB in flight (so bytes in flight are not its limit; the suspect is one bulk copy per
  // 512-1024-byte row and stage), so only m > 8 takes it by default, where x staged once per
  // block (or reused over 32-row tiles) wins: 32-row tiles where there are enough of them,
  // else 16-row, x staged where it fits.
  if (m <= 8 || !ring_fits(nvfp4, jobs, num_jobs, k)) return -1;
  const int rt = rows16 >= 6 * sm_count() ? 2 : 1;
  return kRingFirstVariant + 2 * rt + (ring_stages_x(nvfp4, rt, m, k) ? 1 : 0);
}

bool is_sectors_variant(int v) {
  return v >= kGemvQuantSectorsFirstVariant && v < kGemvQuantSectorsFirstVariant + kGemvQuantSectorsShapes;
}

bool known_variant(int v) {
  return (v >= 0 && v < kRingFirstVariant + kRingVariants && v != 14 && v != 15) || is_sectors_variant(v);
}

// Variant 0's choice where no measured or forced variant applies: the sector kernel where it
// takes the weights (it timed fastest at almost every 27B shape and m, H200 2026-12-02: 16-row
// tiles up to m = 8, 32-row tiles above, where x is reused over more rows), else the older rule.
int default_variant(bool nvfp4, const QuantGemvJob* jobs, int num_jobs, int m, int k, int64_t rows16) {
  if (gemv_quant_sectors_fit(jobs, num_jobs, k)) return kGemvQuantSectorsFirstVariant + (m > 8 ? 2 : 0);
  return default_ring_variant(nvfp4, jobs, num_jobs, m, k, rows16);
}

// The fastest variant per 27B decode shape (format, m, k, rows of the launch), measured by
// bench/bench_cuda_quant.py on the H200 (bench/RESULTS.md, 2026-12-02); other shapes take
// default_ring_variant's rule.
struct MeasuredChoice {
  bool nvfp4;
  int m, k, rows, variant;
};
constexpr MeasuredChoice kMeasured[] = {
#include "backends/cuda/gemv_quant_measured.inc"
};

int measured_variant(bool nvfp4, int m, int k, int64_t rows) {
  for (const MeasuredChoice& c : kMeasured)
    if (c.nvfp4 == nvfp4 && c.m == m && c.k == k && c.rows == rows) return c.variant;
  return 0;
}

// The variant forced for this launch, or 0: NINFER_QUANT_GEMV_VARIANT=N for every launch, or
// NINFER_QUANT_GEMV_TABLE="fmt/m/k/rows=N,..." (fmt fp8|nvfp4, rows: the launch's rows summed
// over its jobs) for the shapes it names (a benchmark's per-shape winners).
int forced_variant(bool nvfp4, int m, int k, int64_t rows) {
  if (const char* v = std::getenv("NINFER_QUANT_GEMV_VARIANT"); v && *v) return std::atoi(v);
  const char* table = std::getenv("NINFER_QUANT_GEMV_TABLE");
  if (!table || !*table) return 0;
  char key[64];
  const int n = std::snprintf(key, sizeof key, "%s/%d/%d/%lld=", nvfp4 ? "nvfp4" : "fp8", m, k,
                              static_cast<long long>(rows));
  for (const char* p = table; (p = std::strstr(p, key)) != nullptr; p += n)
    if (p == table || p[-1] == ',') return std::atoi(p + n);
  return 0;
}

// The default of the software-pipelined form: NINFER_QUANT_GEMV_PIPELINE=0|1 (read at each
// launch, so a benchmark can pick it), else off: the pipelined form has not run on a GPU yet.
bool pipelined_by_default() {
  const char* v = std::getenv("NINFER_QUANT_GEMV_PIPELINE");
  return v && v[0] == '1';
}

// splitmix64 (as kernels_elementwise.cuh's random fills): a counter-based generator.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Random codes: 4 bytes (fp8) or 8 nibbles (nvfp4) per thread and step.
__global__ void random_codes(uint32_t* __restrict__ words, int64_t n_words, uint64_t seed, bool nvfp4) {
  const uint64_t key = mix64(seed + 0x9e3779b97f4a7c15ull);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_words; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(key ^ static_cast<uint64_t>(i));
    uint32_t word = 0;
    const int per_word = nvfp4 ? 8 : 4;
    for (int j = 0; j < per_word; ++j) {
      const float u = 2.0f * static_cast<float>((r >> (8 * (j % 8))) & 0xFF) / 255.0f - 1.0f;  // [-1, 1]
      if (nvfp4) {
        // e2m1 of 6u, nearest: magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6
        const float a = fabsf(6.0f * u);
        const uint32_t mag = a < 0.25f ? 0 : a < 0.75f ? 1 : a < 1.25f ? 2 : a < 1.75f ? 3 : a < 2.5f ? 4
                             : a < 3.5f ? 5 : a < 5.0f ? 6 : 7;
        word |= ((u < 0.0f && mag ? 8u : 0u) | mag) << (4 * j);
      } else {
        const __nv_fp8_storage_t c = __nv_cvt_float_to_fp8(448.0f * u, __NV_SATFINITE, __NV_E4M3);
        word |= static_cast<uint32_t>(c) << (8 * j);
      }
    }
    words[i] = word;
  }
}

__global__ void fill_f32(float* __restrict__ p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) p[i] = v;
}

__global__ void fill_u8(uint8_t* __restrict__ p, int64_t n, uint8_t v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) p[i] = v;
}

unsigned int grid_for(int64_t n) {
  return static_cast<unsigned int>(std::min<int64_t>((n + 255) / 256, 65536));
}

}  // namespace

void launch_gemv_quant_variant(int variant, bool nvfp4, const QuantGemvJob* jobs, int num_jobs, const float* x, int m,
                               int k, bool accumulate, bool overlap, cudaStream_t stream) {
  if (num_jobs < 1 || num_jobs > kQuantGemvMaxJobs || m < 1 || m > 16 || k % (nvfp4 ? 32 : 16) != 0 ||
      !known_variant(variant))
    throw std::invalid_argument("launch_gemv_quant: unsupported jobs/m/k");
  kernels::QuantGemvTable table{};
  table.num_jobs = num_jobs;
  table.accumulate = accumulate ? 1 : 0;
  int64_t rows16 = 0;
  for (int j = 0; j < num_jobs; ++j) {
    if (jobs[j].rows < 1 || jobs[j].group_rows < 1) throw std::invalid_argument("launch_gemv_quant: a weight without rows");
    table.job[j] = jobs[j];
    rows16 += (jobs[j].rows + 15) / 16;
  }
  if (variant == 0) {
    int64_t rows = 0;
    for (int j = 0; j < num_jobs; ++j) rows += jobs[j].rows;
    // Whether variant v takes this launch (the checks below, which throw for a forced one).
    auto applies = [&](int v) {
      if (v <= 0 || !known_variant(v)) return false;
      if (is_sectors_variant(v)) return gemv_quant_sectors_fit(jobs, num_jobs, k);
      if (v == 12 || v == 13) return staged_fits(m, k);
      if (v < kRingFirstVariant) return true;
      return ring_fits(nvfp4, jobs, num_jobs, k) &&
             ((v - kRingFirstVariant) % 2 == 0 || ring_stages_x(nvfp4, (v - kRingFirstVariant) / 2, m, k));
    };
    const int forced = forced_variant(nvfp4, m, k, rows), measured = measured_variant(nvfp4, m, k, rows);
    variant = applies(forced)     ? forced
              : applies(measured) ? measured
                                  : default_variant(nvfp4, jobs, num_jobs, m, k, rows16);
    if (variant < 0) variant = 0;
  }
  if (is_sectors_variant(variant)) {
    if (!gemv_quant_sectors_fit(jobs, num_jobs, k))
      throw std::invalid_argument("launch_gemv_quant: the sector kernel takes k % 128 == 0 and 16-byte aligned codes");
    const int shape = variant - kGemvQuantSectorsFirstVariant, tile_rows = gemv_quant_sectors_tile_rows(shape);
    table.first_tile[0] = 0;
    for (int j = 0; j < num_jobs; ++j)
      table.first_tile[j + 1] = table.first_tile[j] + (jobs[j].rows + tile_rows - 1) / tile_rows;
    launch_gemv_quant_sectors(shape, nvfp4, table, x, m, k, overlap, stream);
    NINFER_CUDA_CHECK_LAUNCH();
    return;
  }
  if (variant >= kRingFirstVariant) {
    const int v = variant - kRingFirstVariant, rt = v / 2;
    const bool staged_x = v % 2 == 1;
    if (!ring_fits(nvfp4, jobs, num_jobs, k) || (staged_x && !ring_stages_x(nvfp4, rt, m, k)))
      throw std::invalid_argument("launch_gemv_quant: m/k/alignment unsupported by the ring kernel variant");
    const int tile_rows = 8 << rt;
    table.first_tile[0] = 0;
    for (int j = 0; j < num_jobs; ++j)
      table.first_tile[j + 1] = table.first_tile[j] + (jobs[j].rows + tile_rows - 1) / tile_rows;
    auto go = [&](auto nvfp4_tag) {
      constexpr bool kNvfp4 = decltype(nvfp4_tag)::value;
      if (rt == 0) launch_ring<kNvfp4, 1>(table, x, m, k, staged_x, overlap, stream);
      if (rt == 1) launch_ring<kNvfp4, 2>(table, x, m, k, staged_x, overlap, stream);
      if (rt == 2) launch_ring<kNvfp4, 4>(table, x, m, k, staged_x, overlap, stream);
    };
    nvfp4 ? go(std::true_type{}) : go(std::false_type{});
    NINFER_CUDA_CHECK_LAUNCH();
    return;
  }
  // m <= 2: 8-row tiles (twice the blocks: more loads in flight, x costs little). Larger m:
  // 16-row tiles (x is read once per 16 weight rows), and when those are few (long rows:
  // down_proj) 8 warps a block, so the SMs' shares stay even with a block per tile
  // (bench/bench_cuda_quant.py, H200 2026-12-01). Variants force: 1 = 8-row tiles, 2 = 16-row
  // tiles of 4 warps, 3 = 16-row tiles of 8 warps.
  // Variant 0 takes the staged kernel at m = 1 and k <= 8192, where it measured faster (mlp
  // gate+up of the 27B shape: 66.0 against 70.7 µs FP8, 68.5 against 71.0 NVFP4; GDN in/out
  // projections equal; down_proj, k = 17408, slower: 49.3 against 40.9; at m = 4 slower; H200
  // 2026-12-01). 12 and 13 force it with 8- and 16-row tiles.
  const bool staged = variant >= 12 || (variant == 0 && m == 1 && k <= 8192 && staged_fits(m, k));
  if (staged && !staged_fits(m, k)) throw std::invalid_argument("launch_gemv_quant: m/k too large for the staged kernel");
  const int tiles16 = static_cast<int>(rows16);
  const int forced = variant % 4, pipeline = variant / 4;
  const int choice = forced > 0 ? forced : m <= 2 ? 1 : tiles16 < 4 * sm_count() ? 3 : 2;
  const bool pipelined = pipeline == 0 ? pipelined_by_default() : pipeline == 2;
  const int tile_rows = choice == 1 ? 8 : 16;
  table.first_tile[0] = 0;
  for (int j = 0; j < num_jobs; ++j)
    table.first_tile[j + 1] = table.first_tile[j] + (jobs[j].rows + tile_rows - 1) / tile_rows;
  if (staged) {
    const bool wide_tiles = variant == 13 || (variant == 0 && m > 2);
    const int rows_per_tile = wide_tiles ? 16 : 8;
    table.first_tile[0] = 0;
    for (int j = 0; j < num_jobs; ++j)
      table.first_tile[j + 1] = table.first_tile[j] + (jobs[j].rows + rows_per_tile - 1) / rows_per_tile;
    if (nvfp4)
      wide_tiles ? launch_staged<true, 2>(table, x, m, k, overlap, stream)
                 : launch_staged<true, 1>(table, x, m, k, overlap, stream);
    else
      wide_tiles ? launch_staged<false, 2>(table, x, m, k, overlap, stream)
                 : launch_staged<false, 1>(table, x, m, k, overlap, stream);
    NINFER_CUDA_CHECK_LAUNCH();
    return;
  }
  auto launch = [&](auto nvfp4_tag, auto pipelined_tag) {
    constexpr bool kNvfp4 = decltype(nvfp4_tag)::value, kPipelined = decltype(pipelined_tag)::value;
    if (choice == 1) launch_tiles<kNvfp4, 1, 4, kPipelined>(table, x, m, k, overlap, stream);
    if (choice == 2) launch_tiles<kNvfp4, 2, 4, kPipelined>(table, x, m, k, overlap, stream);
    if (choice == 3) launch_tiles<kNvfp4, 2, 8, kPipelined>(table, x, m, k, overlap, stream);
  };
  if (nvfp4)
    pipelined ? launch(std::true_type{}, std::true_type{}) : launch(std::true_type{}, std::false_type{});
  else
    pipelined ? launch(std::false_type{}, std::true_type{}) : launch(std::false_type{}, std::false_type{});
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_gemv_quant(bool nvfp4, const QuantGemvJob* jobs, int num_jobs, const float* x, int m, int k,
                       bool accumulate, bool overlap, cudaStream_t stream) {
  launch_gemv_quant_variant(0, nvfp4, jobs, num_jobs, x, m, k, accumulate, overlap, stream);
}

void launch_dequantize_bf16(bool nvfp4, const QuantGemvJob& w, int k, uint16_t* out, cudaStream_t stream) {
  const int64_t groups = static_cast<int64_t>(w.rows) * (k / 8);
  if (groups == 0) return;
  const unsigned int grid = static_cast<unsigned int>((groups + 255) / 256);
  if (nvfp4)
    kernels::dequantize_to_bf16<true><<<grid, 256, 0, stream>>>(w, k, out);
  else
    kernels::dequantize_to_bf16<false><<<grid, 256, 0, stream>>>(w, k, out);
  NINFER_CUDA_CHECK_LAUNCH();
}

void launch_random_quantized(bool nvfp4, uint8_t* blob, int64_t rows, int64_t cols, int64_t group_rows, uint64_t seed,
                             float scale, cudaStream_t stream) {
  const QuantizedLayout l = QuantizedLayout::of(nvfp4 ? DType::NVFP4 : DType::FP8, rows, cols, group_rows);
  const int64_t code_bytes = nvfp4 ? rows * cols / 2 : rows * cols;
  random_codes<<<grid_for(code_bytes / 4), 256, 0, stream>>>(reinterpret_cast<uint32_t*>(blob), code_bytes / 4, seed,
                                                             nvfp4);
  if (nvfp4) {
    fill_u8<<<grid_for(rows * cols / 16), 256, 0, stream>>>(blob + l.scale_offset, rows * cols / 16, 0x7E);  // 448
    fill_f32<<<grid_for(rows), 256, 0, stream>>>(reinterpret_cast<float*>(blob + l.scale2_offset), rows,
                                                 scale / 2688.0f);
  } else {
    const int64_t n = (l.nbytes - l.scale_offset) / 4;
    fill_f32<<<grid_for(n), 256, 0, stream>>>(reinterpret_cast<float*>(blob + l.scale_offset), n, scale / 448.0f);
  }
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace ninfer::cuda
