// Matrix products against column-panel packed weights (see panel_gemm.h).
#include "panel_gemm.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NDP_X86 1
#endif

namespace ndp {

void PackedMatrix::Pack(const float* w, int64_t k, int64_t n, int64_t ld) {
  k_ = k;
  n_ = n;
  data_.assign(static_cast<size_t>(panel_count() * k * kPanelWidth), 0.0f);
  for (int64_t p = 0; p < panel_count(); ++p) {
    const int64_t first = p * kPanelWidth, width = std::min(kPanelWidth, n - first);
    float* out = data_.data() + p * k * kPanelWidth;
    for (int64_t i = 0; i < k; ++i)
      std::memcpy(out + i * kPanelWidth, w + i * ld + first, sizeof(float) * static_cast<size_t>(width));
  }
}

namespace {

// The k range one pass of a block covers: a panel slice of kChunk x kPanelWidth floats (32 KiB) stays in L1 while
// every block of rows multiplies it.
constexpr int64_t kChunk = 256;

// Writes a block of `rows` x kPanelWidth sums (row stride kPanelWidth) into c's first `cols` columns.
inline void StoreBlock(const float* sums, int64_t rows, float* c, int64_t ldc, int64_t cols, bool accumulate) {
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

// A block: sums[R x kPanelWidth] (+)= a[R x k] @ panel[k x kPanelWidth], k in order; `resume` continues the sums
// of the previous k range (so chunking k does not change a single rounding).

// The portable kernel (compilers vectorize the column loop).
template <int R>
void PortableBlock(int64_t k, const float* a, int64_t lda, const float* panel, float* sums, bool resume) {
  if (!resume) std::fill(sums, sums + R * kPanelWidth, 0.0f);
  for (int64_t i = 0; i < k; ++i) {
    const float* b = panel + i * kPanelWidth;
    for (int r = 0; r < R; ++r) {
      const float x = a[r * lda + i];
      for (int64_t j = 0; j < kPanelWidth; ++j) sums[r * kPanelWidth + j] += x * b[j];
    }
  }
}

#ifdef NDP_X86
// Up to 12 rows by two 16-float vectors: 24 accumulators, two panel loads and R broadcasts per k (32 registers).
template <int R>
__attribute__((target("avx512f"))) void Avx512Block(int64_t k, const float* a, int64_t lda, const float* panel,
                                                    float* sums, bool resume) {
  __m512 lo[R], hi[R];
  for (int r = 0; r < R; ++r) {
    lo[r] = resume ? _mm512_load_ps(sums + r * kPanelWidth) : _mm512_setzero_ps();
    hi[r] = resume ? _mm512_load_ps(sums + r * kPanelWidth + 16) : _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < k; ++i) {
    const __m512 b0 = _mm512_load_ps(panel + i * kPanelWidth), b1 = _mm512_load_ps(panel + i * kPanelWidth + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * lda + i]);
      lo[r] = _mm512_fmadd_ps(x, b0, lo[r]);
      hi[r] = _mm512_fmadd_ps(x, b1, hi[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(sums + r * kPanelWidth, lo[r]);
    _mm512_store_ps(sums + r * kPanelWidth + 16, hi[r]);
  }
}

// Three rows by four 8-float vectors: 12 accumulators, one panel vector live at a time (16 ymm registers).
template <int R>
__attribute__((target("avx2,fma"))) void Avx2Block(int64_t k, const float* a, int64_t lda, const float* panel,
                                                   float* sums, bool resume) {
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = resume ? _mm256_load_ps(sums + r * kPanelWidth + 8 * v) : _mm256_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    __m256 x[R];
    for (int r = 0; r < R; ++r) x[r] = _mm256_broadcast_ss(a + r * lda + i);
    for (int v = 0; v < 4; ++v) {
      const __m256 b = _mm256_load_ps(panel + i * kPanelWidth + 8 * v);
      for (int r = 0; r < R; ++r) acc[r][v] = _mm256_fmadd_ps(x[r], b, acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) _mm256_store_ps(sums + r * kPanelWidth + 8 * v, acc[r][v]);
}
#endif

using BlockFn = void (*)(int64_t, const float*, int64_t, const float*, float*, bool);
constexpr int kMaxBlockRows = 12;

// A kernel family: the block for 1..max_rows rows (index rows - 1).
struct Kernels {
  int max_rows;
  BlockFn blocks[kMaxBlockRows];
};

const Kernels kPortable = {4, {PortableBlock<1>, PortableBlock<2>, PortableBlock<3>, PortableBlock<4>}};
#ifdef NDP_X86
const Kernels kAvx512 = {12,
                         {Avx512Block<1>, Avx512Block<2>, Avx512Block<3>, Avx512Block<4>, Avx512Block<5>,
                          Avx512Block<6>, Avx512Block<7>, Avx512Block<8>, Avx512Block<9>, Avx512Block<10>,
                          Avx512Block<11>, Avx512Block<12>}};
const Kernels kAvx2 = {3, {Avx2Block<1>, Avx2Block<2>, Avx2Block<3>}};
#endif

const Kernels& KernelsFor(PanelIsa isa) {
#ifdef NDP_X86
  if (isa == PanelIsa::kAvx512) return kAvx512;
  if (isa == PanelIsa::kAvx2) return kAvx2;
#endif
  return kPortable;
}

bool Supported(PanelIsa isa) {
#ifdef NDP_X86
  __builtin_cpu_init();
  if (isa == PanelIsa::kAvx512) return __builtin_cpu_supports("avx512f");
  if (isa == PanelIsa::kAvx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return true;
#else
  return isa == PanelIsa::kPortable;
#endif
}

constexpr PanelIsa kAllIsas[] = {PanelIsa::kAvx512, PanelIsa::kAvx2, PanelIsa::kPortable};  // best first

thread_local AlignedFloats t_sums;  // [m rounded up to blocks, kPanelWidth] partial sums of one panel

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
               bool accumulate) {
  const Kernels& kernels = KernelsFor(isa);
  const int64_t k = b.rows(), n = b.cols(), step = kernels.max_rows;
  const size_t needed = static_cast<size_t>(((m + step - 1) / step) * step * kPanelWidth);
  if (t_sums.size() < needed) t_sums.resize(needed);
  float* sums = t_sums.data();
  for (int64_t p = 0; p < b.panel_count(); ++p) {
    const int64_t first = p * kPanelWidth, cols = std::min(kPanelWidth, n - first);
    const float* panel = b.panel(p);
    for (int64_t start = 0; start < k; start += kChunk) {  // k outermost within a panel: its slice stays in L1
      const int64_t depth = std::min(kChunk, k - start);
      for (int64_t row = 0; row < m; row += step) {
        const int64_t rows = std::min(step, m - row);
        kernels.blocks[rows - 1](depth, a + row * lda + start, lda, panel + start * kPanelWidth,
                                 sums + row * kPanelWidth, start > 0);
      }
    }
    StoreBlock(sums, m, c + first, ldc, cols, accumulate);
  }
}

}  // namespace ndp
