// Matrix products against column-panel packed weights (see panel_gemm.h).
#include "panel_gemm.h"

#include <array>
#include <cmath>
#include <cstring>

#include "float_convert.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NDP_X86 1
// GCC 12 flags its own AVX-512 widening intrinsics (their _mm512_undefined_epi32 pass-through operand).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "quant_kernels.h"  // after the pragmas: its AVX-512 kernels widen with the same intrinsics

namespace ndp {

void PackedMatrix::Allocate(PanelFormat format, int64_t k, int64_t n, int64_t block, bool uniform_zero,
                            bool kept_scales) {
  format_ = format;
  k_ = k;
  n_ = n;
  block_ = block;
  uniform_zero_ = uniform_zero;
  lazy_.reset();
  kept_scales_ = nullptr;
  scale_stride_ = 0;
  drop_ = nullptr;
  data_.assign(static_cast<size_t>(panel_count() * PanelRows() * RowBytes(format)), 0);
  const auto per_panel = static_cast<size_t>(panel_count() * Blocks() * kPanelWidth);
  scales_.assign(kept_scales ? 0 : per_panel, 0.0f);
  zeros_.assign(uniform_zero ? static_cast<size_t>(Blocks() * kPanelWidth) : per_panel, 0);
}

void PackedMatrix::CopyKeptScales() const {
  const int64_t blocks = Blocks();
  scales_.assign(static_cast<size_t>(panel_count() * blocks * kPanelWidth), 0.0f);
  for (int64_t p = 0; p < panel_count(); ++p) {
    const int64_t first = p * kPanelWidth, width = std::min(kPanelWidth, n_ - first);
    for (int64_t j = 0; j < width; ++j) {
      const float* column = kept_scales_ + (first + j) * scale_stride_;
      for (int64_t b = 0; b < blocks; ++b) scales_[static_cast<size_t>((p * blocks + b) * kPanelWidth + j)] = column[b];
    }
  }
  if (drop_ != nullptr) drop_(kept_scales_, static_cast<size_t>(n_ * scale_stride_) * sizeof(float));
}

void PackedMatrix::PackCodeRows(int bits, const uint8_t* codes, int64_t row_bytes) {
  const int64_t row_out = RowBytes(format_);
  for (int64_t p = 0; p < panel_count(); ++p) {
    const int64_t first = p * kPanelWidth, width = std::min(kPanelWidth, n_ - first);
    uint8_t* out = data_.data() + p * PanelRows() * row_out;
    if (format_ == PanelFormat::kUint4) {  // byte c of a panel row: column c in its low nibble, c + 16 in its high
      for (int64_t j = 0; j < std::min<int64_t>(width, 16); ++j) {
        const uint8_t* low = codes + (first + j) * row_bytes;
        const uint8_t* high = j + 16 < width ? codes + (first + j + 16) * row_bytes : nullptr;
        uint8_t* column = out + j;
        int64_t i = 0;
        if (high != nullptr) {
          for (; i + 1 < k_; i += 2) {
            const uint8_t a = low[i >> 1], b = high[i >> 1];
            column[i * row_out] = static_cast<uint8_t>((a & 0x0F) | (b << 4));
            column[(i + 1) * row_out] = static_cast<uint8_t>((a >> 4) | (b & 0xF0));
          }
          if (i < k_) column[i * row_out] = static_cast<uint8_t>((low[i >> 1] & 0x0F) | (high[i >> 1] << 4));
        } else {
          for (; i + 1 < k_; i += 2) {
            const uint8_t a = low[i >> 1];
            column[i * row_out] = static_cast<uint8_t>(a & 0x0F);
            column[(i + 1) * row_out] = static_cast<uint8_t>(a >> 4);
          }
          if (i < k_) column[i * row_out] = static_cast<uint8_t>(low[i >> 1] & 0x0F);
        }
      }
      continue;
    }
    for (int64_t j = 0; j < width; ++j) {
      const uint8_t* row = codes + (first + j) * row_bytes;
      if (format_ == PanelFormat::kInt8Quads) {  // column j's four codes of a quad of rows side by side
        for (int64_t i = 0; i < k_; ++i)
          out[(i / 4) * 4 * kPanelWidth + j * 4 + i % 4] =
              bits == 8 ? row[i] : static_cast<uint8_t>((i & 1) ? row[i >> 1] >> 4 : row[i >> 1] & 0x0F);
      } else {
        for (int64_t i = 0; i < k_; ++i) out[i * row_out + j] = row[i];
      }
    }
  }
}

namespace {

// The k range one pass of a block covers: a float32 panel slice of kChunk x kPanelWidth values (32 KiB) stays in
// L1 while every block of rows multiplies it.
constexpr int64_t kChunk = 256;

// One call of a float block kernel: sums[R x kPanelWidth] (+)= a[R x (start..stop)] @ panel rows start..stop, k in
// order; `resume` continues the sums of the previous k range (so cutting k into ranges does not change a rounding).
// Quantized panels have kernels of their own (quant_kernels.h).
struct BlockCall {
  const float* a;  // row 0 of the block of rows, column 0
  int64_t lda;
  const uint8_t* panel;
  int64_t start, stop;
  float* sums;
  bool resume;
};

constexpr bool Quantized(PanelFormat f) { return f == PanelFormat::kUint8 || f == PanelFormat::kUint4; }

// Column j of panel row i, widened as a float32 copy made at load time would be.
template <PanelFormat F>
inline float PortableValue(const BlockCall& c, int64_t i, int64_t j) {
  if constexpr (F == PanelFormat::kFloat32) {
    return reinterpret_cast<const float*>(c.panel)[i * kPanelWidth + j];
  } else if constexpr (F == PanelFormat::kFloat16) {
    return HalfToFloat(reinterpret_cast<const uint16_t*>(c.panel)[i * kPanelWidth + j]);
  } else {
    return BFloat16ToFloat(reinterpret_cast<const uint16_t*>(c.panel)[i * kPanelWidth + j]);
  }
}

// The portable kernel (compilers vectorize the column loop).
template <int R, PanelFormat F>
void PortableBlock(const BlockCall& c) {
  float* sums = c.sums;
  if (!c.resume) std::fill(sums, sums + R * kPanelWidth, 0.0f);
  float b[kPanelWidth];
  for (int64_t i = c.start; i < c.stop; ++i) {
    for (int64_t j = 0; j < kPanelWidth; ++j) b[j] = PortableValue<F>(c, i, j);
    for (int r = 0; r < R; ++r) {
      const float x = c.a[r * c.lda + i];
      for (int64_t j = 0; j < kPanelWidth; ++j) sums[r * kPanelWidth + j] += x * b[j];
    }
  }
}

#ifdef NDP_X86
// Panel row i as two vectors of 16 columns.
template <PanelFormat F>
__attribute__((target("avx512f"), always_inline)) inline void Avx512Row(const uint8_t* panel, int64_t i, __m512* b0,
                                                                        __m512* b1) {
  if constexpr (F == PanelFormat::kFloat32) {
    const float* row = reinterpret_cast<const float*>(panel) + i * kPanelWidth;
    *b0 = _mm512_load_ps(row);
    *b1 = _mm512_load_ps(row + 16);
  } else if constexpr (F == PanelFormat::kFloat16) {
    const auto* row = reinterpret_cast<const __m256i*>(panel + i * kPanelWidth * 2);
    *b0 = _mm512_cvtph_ps(_mm256_loadu_si256(row));
    *b1 = _mm512_cvtph_ps(_mm256_loadu_si256(row + 1));
  } else {
    const auto* row = reinterpret_cast<const __m256i*>(panel + i * kPanelWidth * 2);
    *b0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(row)), 16));
    *b1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(row + 1)), 16));
  }
}

// Up to 12 rows by two 16-float vectors: 24 accumulators, two panel vectors and R broadcasts per k.
template <int R, PanelFormat F>
__attribute__((target("avx512f"))) void Avx512Block(const BlockCall& c) {
  __m512 lo[R], hi[R];
  for (int r = 0; r < R; ++r) {
    lo[r] = c.resume ? _mm512_load_ps(c.sums + r * kPanelWidth) : _mm512_setzero_ps();
    hi[r] = c.resume ? _mm512_load_ps(c.sums + r * kPanelWidth + 16) : _mm512_setzero_ps();
  }
  const float* a = c.a;
  for (int64_t i = c.start; i < c.stop; ++i) {
    __m512 b0, b1;
    Avx512Row<F>(c.panel, i, &b0, &b1);
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * c.lda + i]);
      lo[r] = _mm512_fmadd_ps(x, b0, lo[r]);
      hi[r] = _mm512_fmadd_ps(x, b1, hi[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(c.sums + r * kPanelWidth, lo[r]);
    _mm512_store_ps(c.sums + r * kPanelWidth + 16, hi[r]);
  }
}

// Panel row i as four vectors of 8 columns.
template <PanelFormat F>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void Avx2Row(const uint8_t* panel, int64_t i,
                                                                             __m256* b) {
  if constexpr (F == PanelFormat::kFloat32) {
    const float* row = reinterpret_cast<const float*>(panel) + i * kPanelWidth;
    for (int v = 0; v < 4; ++v) b[v] = _mm256_load_ps(row + 8 * v);
  } else if constexpr (F == PanelFormat::kFloat16) {
    const auto* row = reinterpret_cast<const __m128i*>(panel + i * kPanelWidth * 2);
    for (int v = 0; v < 4; ++v) b[v] = _mm256_cvtph_ps(_mm_loadu_si128(row + v));
  } else {
    const auto* row = reinterpret_cast<const __m128i*>(panel + i * kPanelWidth * 2);
    for (int v = 0; v < 4; ++v)
      b[v] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(row + v)), 16));
  }
}

// Three rows by four 8-float vectors: 12 accumulators (16 ymm registers).
template <int R, PanelFormat F>
__attribute__((target("avx2,fma,f16c"))) void Avx2Block(const BlockCall& c) {
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v)
      acc[r][v] = c.resume ? _mm256_load_ps(c.sums + r * kPanelWidth + 8 * v) : _mm256_setzero_ps();
  for (int64_t i = c.start; i < c.stop; ++i) {
    __m256 b[4];
    Avx2Row<F>(c.panel, i, b);
    __m256 x[R];
    for (int r = 0; r < R; ++r) x[r] = _mm256_broadcast_ss(c.a + r * c.lda + i);
    for (int v = 0; v < 4; ++v)
      for (int r = 0; r < R; ++r) acc[r][v] = _mm256_fmadd_ps(x[r], b[v], acc[r][v]);
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) _mm256_store_ps(c.sums + r * kPanelWidth + 8 * v, acc[r][v]);
}
#endif

using BlockFn = void (*)(const BlockCall&);
constexpr int kMaxBlockRows = 12;
constexpr int kFormats = 3;  // the float formats

// A kernel family: the block for 1..max_rows rows (index rows - 1) of one panel format.
struct Kernels {
  int max_rows;
  BlockFn blocks[kMaxBlockRows];
};

template <PanelFormat F>
constexpr Kernels PortableKernels() {
  return {4, {PortableBlock<1, F>, PortableBlock<2, F>, PortableBlock<3, F>, PortableBlock<4, F>}};
}
const Kernels kPortable[kFormats] = {PortableKernels<PanelFormat::kFloat32>(), PortableKernels<PanelFormat::kFloat16>(),
                                     PortableKernels<PanelFormat::kBFloat16>()};
#ifdef NDP_X86
template <PanelFormat F>
constexpr Kernels Avx512Kernels() {
  return {12,
          {Avx512Block<1, F>, Avx512Block<2, F>, Avx512Block<3, F>, Avx512Block<4, F>, Avx512Block<5, F>,
           Avx512Block<6, F>, Avx512Block<7, F>, Avx512Block<8, F>, Avx512Block<9, F>, Avx512Block<10, F>,
           Avx512Block<11, F>, Avx512Block<12, F>}};
}
template <PanelFormat F>
constexpr Kernels Avx2Kernels() {
  return {3, {Avx2Block<1, F>, Avx2Block<2, F>, Avx2Block<3, F>}};
}
const Kernels kAvx512[kFormats] = {Avx512Kernels<PanelFormat::kFloat32>(), Avx512Kernels<PanelFormat::kFloat16>(),
                                   Avx512Kernels<PanelFormat::kBFloat16>()};
const Kernels kAvx2[kFormats] = {Avx2Kernels<PanelFormat::kFloat32>(), Avx2Kernels<PanelFormat::kFloat16>(),
                                 Avx2Kernels<PanelFormat::kBFloat16>()};
#endif

const Kernels& KernelsFor(PanelIsa isa, PanelFormat format) {
  const auto f = static_cast<size_t>(format);
#ifdef NDP_X86
  if (isa == PanelIsa::kAvx512) return kAvx512[f];
  if (isa == PanelIsa::kAvx2) return kAvx2[f];
#endif
  return kPortable[f];
}

bool Supported(PanelIsa isa) {
#ifdef NDP_X86
  __builtin_cpu_init();
  if (isa == PanelIsa::kAvx512) return __builtin_cpu_supports("avx512f");
  if (isa == PanelIsa::kAvx2)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return true;
#else
  return isa == PanelIsa::kPortable;
#endif
}


// One call of an int8 block kernel: out[R x kPanelWidth] = rows 0..R-1 of `a` @ one kInt8Quads panel, every
// quantization block of its K rows in order (see PanelGemmInt8).
struct Int8Call {
  Int8Rows a;
  const uint8_t* panel;
  const float* scales;   // [blocks][kPanelWidth]
  const uint8_t* zeros;  // [blocks][kPanelWidth]
  int64_t k, block;
  float* out;
};

// Quads [first, end) of block b: its rows, padded to quads (the padding's codes and values are 0).
inline void QuadRange(const Int8Call& c, int64_t b, int64_t* first, int64_t* end) {
  *first = b * c.block / 4;
  *end = (std::min(c.k, (b + 1) * c.block) + 3) / 4;
}

inline int32_t QuadOf(const int8_t* q) {
  int32_t value;
  std::memcpy(&value, q, sizeof value);
  return value;
}

template <int R>
void PortableInt8Block(const Int8Call& c) {
  float sums[R][kPanelWidth] = {};
  const int64_t blocks = (c.k + c.block - 1) / c.block;
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t first, end;
    QuadRange(c, b, &first, &end);
    int32_t dots[R][kPanelWidth] = {};
    for (int64_t quad = first; quad < end; ++quad) {
      const uint8_t* w = c.panel + quad * 4 * kPanelWidth;
      for (int r = 0; r < R; ++r) {
        const int8_t* x = c.a.q + r * c.a.ldq + quad * 4;
        for (int64_t j = 0; j < kPanelWidth; ++j)
          for (int i = 0; i < 4; ++i) dots[r][j] += static_cast<int32_t>(w[j * 4 + i]) * x[i];
      }
    }
    const float* scales = c.scales + b * kPanelWidth;
    const uint8_t* zeros = c.zeros + b * kPanelWidth;
    for (int r = 0; r < R; ++r) {
      const int32_t sum = c.a.sums[r * c.a.lds + b];
      const float scale = c.a.scales[r * c.a.lds + b];
      for (int64_t j = 0; j < kPanelWidth; ++j) {
        const float product = scale * scales[j];
        sums[r][j] = std::fma(static_cast<float>(dots[r][j] - static_cast<int32_t>(zeros[j]) * sum), product,
                              sums[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(c.out + r * kPanelWidth, sums[r], sizeof sums[r]);
}

#ifdef NDP_X86
// Up to 6 rows: 12 integer and 12 float accumulators of 16 columns, two quad vectors and one broadcast.
template <int R>
__attribute__((target("avx512f,avx512vnni"))) void VnniBlock(const Int8Call& c) {
  __m512 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  const int64_t blocks = (c.k + c.block - 1) / c.block;
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t first, end;
    QuadRange(c, b, &first, &end);
    __m512i dot_lo[R], dot_hi[R];
    for (int r = 0; r < R; ++r) dot_lo[r] = dot_hi[r] = _mm512_setzero_si512();
    for (int64_t quad = first; quad < end; ++quad) {
      const uint8_t* w = c.panel + quad * 4 * kPanelWidth;
      const __m512i w0 = _mm512_load_si512(w), w1 = _mm512_load_si512(w + 64);
      for (int r = 0; r < R; ++r) {
        const __m512i x = _mm512_set1_epi32(QuadOf(c.a.q + r * c.a.ldq + quad * 4));
        dot_lo[r] = _mm512_dpbusd_epi32(dot_lo[r], w0, x);
        dot_hi[r] = _mm512_dpbusd_epi32(dot_hi[r], w1, x);
      }
    }
    const float* scales = c.scales + b * kPanelWidth;
    const uint8_t* zeros = c.zeros + b * kPanelWidth;
    const __m512 s0 = _mm512_loadu_ps(scales), s1 = _mm512_loadu_ps(scales + 16);
    const __m512i z0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zeros)));
    const __m512i z1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zeros + 16)));
    for (int r = 0; r < R; ++r) {
      const __m512i sum = _mm512_set1_epi32(c.a.sums[r * c.a.lds + b]);
      const __m512 scale = _mm512_set1_ps(c.a.scales[r * c.a.lds + b]);
      const __m512 d0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot_lo[r], _mm512_mullo_epi32(z0, sum)));
      const __m512 d1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot_hi[r], _mm512_mullo_epi32(z1, sum)));
      lo[r] = _mm512_fmadd_ps(d0, _mm512_mul_ps(scale, s0), lo[r]);
      hi[r] = _mm512_fmadd_ps(d1, _mm512_mul_ps(scale, s1), hi[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(c.out + r * kPanelWidth, lo[r]);
    _mm512_storeu_ps(c.out + r * kPanelWidth + 16, hi[r]);
  }
}

// One row without VNNI, exactly: codes and values widened to 16 bits, pairs multiplied and added to 32 bits
// (vpmaddwd), each column's two pair sums kept apart until its block ends.
__attribute__((target("avx2,fma"))) void Avx2Int8Row(const Int8Call& c) {
  __m256 acc[4];
  for (int v = 0; v < 4; ++v) acc[v] = _mm256_setzero_ps();
  const int64_t blocks = (c.k + c.block - 1) / c.block;
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t first, end;
    QuadRange(c, b, &first, &end);
    __m256i pairs[8];  // 4 columns' two pair sums each: columns 4g..4g+3
    for (int g = 0; g < 8; ++g) pairs[g] = _mm256_setzero_si256();
    for (int64_t quad = first; quad < end; ++quad) {
      const uint8_t* w = c.panel + quad * 4 * kPanelWidth;
      const __m256i x = _mm256_cvtepi8_epi16(_mm_set1_epi32(QuadOf(c.a.q + quad * 4)));  // the 4 values, 4 times
      for (int g = 0; g < 8; ++g) {
        const __m256i codes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16 * g)));
        pairs[g] = _mm256_add_epi32(pairs[g], _mm256_madd_epi16(codes, x));
      }
    }
    const float* scales = c.scales + b * kPanelWidth;
    const uint8_t* zeros = c.zeros + b * kPanelWidth;
    const __m256i sum = _mm256_set1_epi32(c.a.sums[b]);
    const __m256 scale = _mm256_set1_ps(c.a.scales[b]);
    for (int v = 0; v < 4; ++v) {  // columns 8v..8v+7: groups 2v and 2v + 1
      const __m256i dots = _mm256_permute4x64_epi64(_mm256_hadd_epi32(pairs[2 * v], pairs[2 * v + 1]), 0xD8);
      const __m256i zero = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(zeros + 8 * v)));
      const __m256 d = _mm256_cvtepi32_ps(_mm256_sub_epi32(dots, _mm256_mullo_epi32(zero, sum)));
      acc[v] = _mm256_fmadd_ps(d, _mm256_mul_ps(scale, _mm256_loadu_ps(scales + 8 * v)), acc[v]);
    }
  }
  for (int v = 0; v < 4; ++v) _mm256_storeu_ps(c.out + 8 * v, acc[v]);
}
#endif

using Int8Fn = void (*)(const Int8Call&);
constexpr int kMaxInt8Rows = 6;
struct Int8Kernels {
  int max_rows;
  Int8Fn blocks[kMaxInt8Rows];
};
const Int8Kernels kPortableInt8 = {4, {PortableInt8Block<1>, PortableInt8Block<2>, PortableInt8Block<3>,
                                       PortableInt8Block<4>}};
#ifdef NDP_X86
const Int8Kernels kVnni = {6, {VnniBlock<1>, VnniBlock<2>, VnniBlock<3>, VnniBlock<4>, VnniBlock<5>, VnniBlock<6>}};
const Int8Kernels kAvx2Int8 = {1, {Avx2Int8Row}};
#endif

// The int8 kernels for `isa`: AVX-512 with VNNI where the CPU has it (else the AVX2 ones: the same bits).
const Int8Kernels& Int8KernelsFor(PanelIsa isa) {
#ifdef NDP_X86
  __builtin_cpu_init();
  if (isa == PanelIsa::kAvx512 && __builtin_cpu_supports("avx512vnni")) return kVnni;
  if (isa == PanelIsa::kAvx512 || isa == PanelIsa::kAvx2) return kAvx2Int8;
#endif
  return kPortableInt8;
}

constexpr PanelIsa kAllIsas[] = {PanelIsa::kAvx512, PanelIsa::kAvx2, PanelIsa::kPortable};  // best first

thread_local AlignedFloats t_sums;  // [m rounded up to blocks, kPanelWidth] partial sums of one panel

// Writes `rows` rows of kPanelWidth sums into c's first `cols` columns.
void StoreSums(const float* sums, int64_t rows, float* c, int64_t ldc, int64_t cols, bool accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
    float* out = c + r * ldc;
    const float* in = sums + r * kPanelWidth;
    if (accumulate) {
      for (int64_t j = 0; j < cols; ++j) out[j] += in[j];
    } else {
      std::memcpy(out, in, sizeof(float) * static_cast<size_t>(cols));
    }
  }
}

// The quantized kernels of one instruction set (quant_kernels.h): widening a k range of a panel into floats (per
// code format: kUint8, kUint4), and the products of 1..max_rows rows against it.
using WidenFn = void (*)(const quant::Product&, const quant::Panel&, int64_t, int64_t, float*);
using WidenedFn = void (*)(const quant::Product&, const quant::Panel&, const float*, const float*, int64_t, int64_t,
                           float*);
struct QuantKernels {
  WidenFn widen[2];
  int max_rows;
  WidenedFn blocks[kMaxBlockRows];
};

const QuantKernels kPortableQuant = {
    {quant::PortableWiden<PanelFormat::kUint8>, quant::PortableWiden<PanelFormat::kUint4>},
    4,
    {quant::PortableWidenedBlocks<1>, quant::PortableWidenedBlocks<2>, quant::PortableWidenedBlocks<3>,
     quant::PortableWidenedBlocks<4>}};
#ifdef NDP_X86
const QuantKernels kAvx2Quant = {
    {quant::Avx2Widen<PanelFormat::kUint8>, quant::Avx2Widen<PanelFormat::kUint4>},
    3,
    {quant::Avx2WidenedBlocks<1>, quant::Avx2WidenedBlocks<2>, quant::Avx2WidenedBlocks<3>}};
const WidenedFn kAvx512Widened[kMaxBlockRows] = {
    quant::Avx512WidenedBlocks<1>,  quant::Avx512WidenedBlocks<2>,  quant::Avx512WidenedBlocks<3>,
    quant::Avx512WidenedBlocks<4>,  quant::Avx512WidenedBlocks<5>,  quant::Avx512WidenedBlocks<6>,
    quant::Avx512WidenedBlocks<7>,  quant::Avx512WidenedBlocks<8>,  quant::Avx512WidenedBlocks<9>,
    quant::Avx512WidenedBlocks<10>, quant::Avx512WidenedBlocks<11>, quant::Avx512WidenedBlocks<12>};
const WidenFn kAvx512Widen[2][2] = {  // [kUint4][zero points that vary]
    {quant::Avx512Widen<PanelFormat::kUint8, false>, quant::Avx512Widen<PanelFormat::kUint8, true>},
    {quant::Avx512Widen<PanelFormat::kUint4, false>, quant::Avx512Widen<PanelFormat::kUint4, true>}};

// At most this many rows widen the codes in registers (Avx512Stream) rather than into a buffer once per call.
constexpr int64_t kStreamRows = 4;
// Panels one streaming call covers, by rows: four independent streams of codes keep enough memory requests in
// flight; more rows fill the registers with fewer.
constexpr int64_t StreamPanels(int64_t rows) { return rows <= 2 ? 4 : rows == 3 ? 2 : 1; }

using StreamFn = void (*)(const quant::Product&, const quant::Panel*, float*);
template <PanelFormat F, bool kZeros>
constexpr std::array<std::array<StreamFn, 4>, kStreamRows> StreamKernels() {  // [rows - 1][panels - 1]
  using quant::Avx512Stream;
  return {{{Avx512Stream<1, 1, F, kZeros>, Avx512Stream<1, 2, F, kZeros>, Avx512Stream<1, 3, F, kZeros>,
            Avx512Stream<1, 4, F, kZeros>},
           {Avx512Stream<2, 1, F, kZeros>, Avx512Stream<2, 2, F, kZeros>, Avx512Stream<2, 3, F, kZeros>,
            Avx512Stream<2, 4, F, kZeros>},
           {Avx512Stream<3, 1, F, kZeros>, Avx512Stream<3, 2, F, kZeros>, nullptr, nullptr},
           {Avx512Stream<4, 1, F, kZeros>, nullptr, nullptr, nullptr}}};
}
const std::array<std::array<StreamFn, 4>, kStreamRows> kStream[2][2] = {  // [kUint4][zero points that vary]
    {StreamKernels<PanelFormat::kUint8, false>(), StreamKernels<PanelFormat::kUint8, true>()},
    {StreamKernels<PanelFormat::kUint4, false>(), StreamKernels<PanelFormat::kUint4, true>()}};
#endif

thread_local AlignedFloats t_widened;  // a k range of one panel widened to float (quantized products)

quant::Panel PanelOf(const PackedMatrix& b, int64_t p) {
  return {b.panel(p), b.scales(p), b.uniform_zero() ? nullptr : b.zeros(p)};
}

// PanelGemm for kUint8 / kUint4 panels [first_panel, end_panel) (quant_kernels.h).
void QuantizedGemm(PanelIsa isa, int64_t m, const float* a, int64_t lda, const PackedMatrix& b, float* c,
                   int64_t ldc, bool accumulate, int64_t first_panel, int64_t end_panel) {
  quant::Product g{};
  g.a = a;
  g.lda = lda;
  g.k = b.rows();
  g.block = b.block();
  const bool zeros = !b.uniform_zero(), u4 = b.format() == PanelFormat::kUint4;
  g.zu = zeros ? 0 : b.zeros(0)[0];
  for (int code = 0; code < 16; ++code) g.table[code] = static_cast<float>(code - g.zu);
  const int64_t n = b.cols();
  const auto needed = static_cast<size_t>(std::max<int64_t>(m, 4 * 2) * kPanelWidth);  // streaming: 4 panels x 2 rows
  if (t_sums.size() < needed) t_sums.resize(needed);
  float* sums = t_sums.data();
  auto store = [&](int64_t p, const float* panel_sums) {
    StoreSums(panel_sums, m, c + p * kPanelWidth, ldc, std::min(kPanelWidth, n - p * kPanelWidth), accumulate);
  };
#ifdef NDP_X86
  if (isa == PanelIsa::kAvx512 && m <= kStreamRows) {
    const auto& kernels = kStream[u4][zeros][m - 1];
    const int64_t width = StreamPanels(m);
    for (int64_t p = first_panel; p < end_panel; p += width) {
      const int64_t count = std::min<int64_t>(width, end_panel - p);
      quant::Panel panels[4] = {};
      for (int64_t q = 0; q < count; ++q) panels[q] = PanelOf(b, p + q);
      kernels[count - 1](g, panels, sums);
      for (int64_t q = 0; q < count; ++q) store(p + q, sums + q * m * kPanelWidth);
    }
    return;
  }
  const bool wide = isa == PanelIsa::kAvx512;
  const QuantKernels& kernels = isa == PanelIsa::kAvx2 ? kAvx2Quant : kPortableQuant;
  const WidenedFn* blocks = wide ? kAvx512Widened : kernels.blocks;
  const int64_t step = wide ? kMaxBlockRows : kernels.max_rows;
  const WidenFn widen = wide ? kAvx512Widen[u4][zeros] : kernels.widen[u4];
#else
  const WidenedFn* blocks = kPortableQuant.blocks;
  const int64_t step = kPortableQuant.max_rows;
  const WidenFn widen = kPortableQuant.widen[u4];
#endif
  // whole quantization blocks per widened range, about kChunk rows (one block when blocks are longer)
  const int64_t chunk = std::max<int64_t>(1, kChunk / g.block) * g.block;
  const int64_t tiles = (m + step - 1) / step;
  const auto widened_size = static_cast<size_t>(std::min(chunk, g.k) * kPanelWidth);
  if (t_widened.size() < widened_size) t_widened.resize(widened_size);
  for (int64_t p = first_panel; p < end_panel; ++p) {
    const quant::Panel panel = PanelOf(b, p);
    std::fill(sums, sums + m * kPanelWidth, 0.0f);
    for (int64_t start = 0; start < g.k; start += chunk) {
      const int64_t stop = std::min(g.k, start + chunk);
      widen(g, panel, start, stop, t_widened.data());
      // blocks of rows as even as `step` allows (64 rows: 11 11 11 11 10 10, not 12 12 12 12 12 4): a short
      // block reloads the widened panel for few products
      for (int64_t tile = 0, row = 0; tile < tiles; ++tile) {
        const int64_t rows = m / tiles + (tile < m % tiles ? 1 : 0);
        blocks[rows - 1](g, panel, a + row * lda, t_widened.data(), start, stop, sums + row * kPanelWidth);
        row += rows;
      }
    }
    store(p, sums);
  }
}

}  // namespace

const char* PanelIsaName(PanelIsa isa) {
  return isa == PanelIsa::kAvx512 ? "avx512f" : isa == PanelIsa::kAvx2 ? "avx2" : "portable";
}

std::string ChoosePanelIsa(const char* requested, PanelIsa* out) {
  const std::string name = requested ? requested : "";
  for (PanelIsa isa : kAllIsas) {
    if (name.empty() ? Supported(isa) : name == PanelIsaName(isa)) {
      if (!Supported(isa)) return std::string(kKernelIsaEnv) + "=" + name + ": this CPU cannot run it";
      *out = isa;
      return "";
    }
  }
  return std::string(kKernelIsaEnv) + " must be avx512f, avx2 or portable, got '" + name + "'";
}

void PanelGemm(PanelIsa isa, int64_t m, const float* a, int64_t lda, const PackedMatrix& b, float* c, int64_t ldc,
               bool accumulate, int64_t first_panel, int64_t end_panel) {
  if (end_panel < 0 || end_panel > b.panel_count()) end_panel = b.panel_count();
  if (Quantized(b.format())) {
    QuantizedGemm(isa, m, a, lda, b, c, ldc, accumulate, first_panel, end_panel);
    return;
  }
  const Kernels& kernels = KernelsFor(isa, b.format());
  const int64_t k = b.rows(), n = b.cols(), step = kernels.max_rows;
  const size_t needed = static_cast<size_t>(((m + step - 1) / step) * step * kPanelWidth);
  if (t_sums.size() < needed) t_sums.resize(needed);
  float* sums = t_sums.data();
  BlockCall call{};
  call.lda = lda;
  for (int64_t p = first_panel; p < end_panel; ++p) {
    const int64_t first = p * kPanelWidth, cols = std::min(kPanelWidth, n - first);
    call.panel = b.panel(p);
    // k outermost within a panel: its slice stays in L1 while every block of rows multiplies it
    for (int64_t start = 0; start < k;) {
      const int64_t stop = std::min(k, start + kChunk);
      call.start = start;
      call.stop = stop;
      call.resume = start > 0;
      for (int64_t row = 0; row < m; row += step) {
        call.a = a + row * lda;
        call.sums = sums + row * kPanelWidth;
        kernels.blocks[std::min(step, m - row) - 1](call);
      }
      start = stop;
    }
    StoreSums(sums, m, c + first, ldc, cols, accumulate);
  }
}

void PanelGemmInt8(PanelIsa isa, int64_t m, const Int8Rows& a, const PackedMatrix& b, float* c, int64_t ldc,
                   bool accumulate, int64_t first_panel, int64_t end_panel) {
  const Int8Kernels& kernels = Int8KernelsFor(isa);
  const int64_t n = b.cols(), step = kernels.max_rows;
  const size_t needed = static_cast<size_t>(((m + step - 1) / step) * step * kPanelWidth);
  if (t_sums.size() < needed) t_sums.resize(needed);
  Int8Call call{};
  call.k = b.rows();
  call.block = b.block();
  if (end_panel < 0 || end_panel > b.panel_count()) end_panel = b.panel_count();
  for (int64_t p = first_panel; p < end_panel; ++p) {
    const int64_t first = p * kPanelWidth, cols = std::min(kPanelWidth, n - first);
    call.panel = b.panel(p);
    call.scales = b.scales(p);
    call.zeros = b.zeros(p);
    for (int64_t row = 0; row < m; row += step) {
      call.a = a.Row(row);
      call.out = t_sums.data() + row * kPanelWidth;
      kernels.blocks[std::min(step, m - row) - 1](call);
    }
    StoreSums(t_sums.data(), m, c + first, ldc, cols, accumulate);
  }
}

}  // namespace ndp
