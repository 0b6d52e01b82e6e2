// The products of PanelGemm against block-quantized panels (PanelFormat kUint8 / kUint4); panel_gemm.cc is the
// only file that includes this one.
//
// Every kernel, at every row count, computes output (r, j) the same way, so the instruction set, the number of rows
// in a call and how they are blocked change no bit (the portable kernel may differ in the last bits where its
// compiler does not fuse its multiply-adds):
//   for each quantization block b of the K inputs, in order:
//     B = sum over the block's inputs i, in increasing order, of x[r, i] * float(code[i, j] - zero[b, j]) (the
//         integer difference, exact in float), fused multiply-adds from 0;
//     acc = fma(B, scale[b, j], acc).
// The scale multiplies a block's sum once instead of every weight (one rounding per block, not one per weight and
// one per product), which also keeps the partial sums of a block small: the error against an exact sum is no
// larger than that of widening every weight to float32 first.
//
// Two ways to run it: a streaming kernel (AVX-512, one to four rows) widens the codes in registers, up to four
// panels at a time so that independent sums hide the fused multiply-add latency and several streams of codes are in
// flight, and prefetches the codes ahead (a decode step reads every weight once, from memory); the other widens
// each k range of a panel once per call into a float buffer that stays in L1 and multiplies every block of rows
// against it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "panel_gemm.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace ndp {
namespace quant {

// What every kernel of one product needs besides its panels.
struct Product {
  const float* a;  // row 0, column 0
  int64_t lda;
  int64_t k, block;
  int32_t zu;       // the uniform zero point (when Panel::zeros is null)
  float table[16];  // 4-bit codes and a uniform zero point: float(code - zu) for each code
};

// One panel: its codes, [blocks][kPanelWidth] scales and zero points (null when uniform).
struct Panel {
  const uint8_t* codes;
  const float* scales;
  const uint8_t* zeros;
};

constexpr int64_t kRowBytesU8 = kPanelWidth, kRowBytesU4 = kPanelWidth / 2;
// How far ahead of the row it widens the streaming kernel asks for codes: a few hundred cycles of memory latency
// at the rate it consumes them.
constexpr int64_t kPrefetchBytes = 2048;

// Column j of code row i as float(code - zero), portably (the reference the vector code follows).
template <PanelFormat F>
inline float PortableCode(const uint8_t* codes, int64_t i, int64_t j, int32_t zu) {
  if constexpr (F == PanelFormat::kUint8) {
    return static_cast<float>(static_cast<int32_t>(codes[i * kRowBytesU8 + j]) - zu);
  } else {
    const uint8_t byte = codes[i * kRowBytesU4 + (j % 16)];
    return static_cast<float>(static_cast<int32_t>(j < 16 ? (byte & 0x0F) : (byte >> 4)) - zu);
  }
}

// buf[(i - start) * kPanelWidth + j] = float(code[i, j] - zero[i / block, j]) for rows [start, stop).
template <PanelFormat F>
void PortableWiden(const Product& g, const Panel& p, int64_t start, int64_t stop, float* buf) {
  for (int64_t i = start; i < stop; ++i) {
    const uint8_t* zeros = p.zeros ? p.zeros + (i / g.block) * kPanelWidth : nullptr;
    for (int64_t j = 0; j < kPanelWidth; ++j)
      buf[(i - start) * kPanelWidth + j] = PortableCode<F>(p.codes, i, j, zeros ? zeros[j] : g.zu);
  }
}

// sums[R x kPanelWidth] (+)= rows 0..R-1 of a against the widened rows [start, stop) in `buf` (whole blocks, the
// last one possibly cut by K).
template <int R>
void PortableWidenedBlocks(const Product& g, const Panel& p, const float* a, const float* buf, int64_t start,
                           int64_t stop, float* sums) {
  for (int64_t first = start; first < stop; first += g.block) {
    const int64_t b = first / g.block, last = std::min(stop, first + g.block);
    float blk[R][kPanelWidth] = {};
    for (int64_t i = first; i < last; ++i) {
      const float* w = buf + (i - start) * kPanelWidth;
      for (int r = 0; r < R; ++r) {
        const float x = a[r * g.lda + i];
        for (int64_t j = 0; j < kPanelWidth; ++j) blk[r][j] += x * w[j];
      }
    }
    const float* scales = p.scales + b * kPanelWidth;
    for (int r = 0; r < R; ++r)
      for (int64_t j = 0; j < kPanelWidth; ++j)
        sums[r * kPanelWidth + j] = std::fma(blk[r][j], scales[j], sums[r * kPanelWidth + j]);
  }
}

#if defined(__x86_64__) || defined(__i386__)
// Code row i as two vectors of 16 columns of float(code - zero). kZeros: the zero points of the row's block, z[0] and
// z[1] (else the uniform one in both, and for 4-bit codes `table`).
template <PanelFormat F, bool kZeros>
__attribute__((target("avx512f"), always_inline)) inline void Avx512Codes(const uint8_t* codes, int64_t i,
                                                                          __m512 table, const __m512i* z, __m512* v0,
                                                                          __m512* v1) {
  if constexpr (F == PanelFormat::kUint8) {
    const auto* row = reinterpret_cast<const __m128i*>(codes + i * kRowBytesU8);
    *v0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(row)), z[0]));
    *v1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(row + 1)), z[1]));
  } else {
    const __m512i bytes =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i * kRowBytesU4)));
    if constexpr (kZeros) {
      *v0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(bytes, _mm512_set1_epi32(0x0F)), z[0]));
      *v1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(bytes, 4), z[1]));
    } else {  // a 16-entry table lookup widens a nibble (vpermps reads an index's low 4 bits)
      *v0 = _mm512_permutexvar_ps(bytes, table);
      *v1 = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
    }
  }
}

// The zero points of block b (kZeros), else the uniform one, for columns 0..15 and 16..31.
template <bool kZeros>
__attribute__((target("avx512f"), always_inline)) inline void Avx512Zeros(const Product& g, const Panel& p, int64_t b,
                                                                          __m512i* z) {
  for (int h = 0; h < 2; ++h)
    z[h] = kZeros ? _mm512_cvtepu8_epi32(
                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p.zeros + b * kPanelWidth + 16 * h)))
                  : _mm512_set1_epi32(g.zu);
}

// R rows against P panels over all K, codes widened in registers: sums[P][R][kPanelWidth] = the
// products.
template <int R, int P, PanelFormat F, bool kZeros>
__attribute__((target("avx512f"))) void Avx512Stream(const Product& g, const Panel* panels, float* sums) {
  constexpr int64_t kRowBytes = F == PanelFormat::kUint8 ? kRowBytesU8 : kRowBytesU4;
  const __m512 table = _mm512_loadu_ps(g.table);
  __m512 acc[P][R][2];
  for (int p = 0; p < P; ++p)
    for (int r = 0; r < R; ++r) acc[p][r][0] = acc[p][r][1] = _mm512_setzero_ps();
  for (int64_t start = 0, b = 0; start < g.k; start += g.block, ++b) {
    const int64_t stop = std::min(g.k, start + g.block);
    __m512 blk[P][R][2];
    __m512i z[P][2];
    for (int p = 0; p < P; ++p) {
      Avx512Zeros<kZeros>(g, panels[p], b, z[p]);
      for (int r = 0; r < R; ++r) blk[p][r][0] = blk[p][r][1] = _mm512_setzero_ps();
    }
    for (int64_t i = start; i < stop; ++i) {
      __m512 v[P][2];
      for (int p = 0; p < P; ++p) {
        _mm_prefetch(reinterpret_cast<const char*>(panels[p].codes + i * kRowBytes + kPrefetchBytes), _MM_HINT_T0);
        Avx512Codes<F, kZeros>(panels[p].codes, i, table, z[p], &v[p][0], &v[p][1]);
      }
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_set1_ps(g.a[r * g.lda + i]);
        for (int p = 0; p < P; ++p) {
          blk[p][r][0] = _mm512_fmadd_ps(x, v[p][0], blk[p][r][0]);
          blk[p][r][1] = _mm512_fmadd_ps(x, v[p][1], blk[p][r][1]);
        }
      }
    }
    for (int p = 0; p < P; ++p) {
      for (int h = 0; h < 2; ++h) {
        const __m512 scale = _mm512_loadu_ps(panels[p].scales + b * kPanelWidth + 16 * h);
        for (int r = 0; r < R; ++r) acc[p][r][h] = _mm512_fmadd_ps(blk[p][r][h], scale, acc[p][r][h]);
      }
    }
  }
  for (int p = 0; p < P; ++p)
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < 2; ++h) _mm512_storeu_ps(sums + (p * R + r) * kPanelWidth + 16 * h, acc[p][r][h]);
}

// buf[(i - start) * kPanelWidth + j] = float(code[i, j] - zero) for rows [start, stop) (whole blocks).
template <PanelFormat F, bool kZeros>
__attribute__((target("avx512f"))) void Avx512Widen(const Product& g, const Panel& p, int64_t start, int64_t stop,
                                                   float* buf) {
  constexpr int64_t kRowBytes = F == PanelFormat::kUint8 ? kRowBytesU8 : kRowBytesU4;
  const __m512 table = _mm512_loadu_ps(g.table);
  for (int64_t first = start; first < stop; first += g.block) {
    __m512i z[2];
    Avx512Zeros<kZeros>(g, p, first / g.block, z);
    for (int64_t i = first; i < std::min(stop, first + g.block); ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(p.codes + i * kRowBytes + kPrefetchBytes), _MM_HINT_T0);
      __m512 v0, v1;
      Avx512Codes<F, kZeros>(p.codes, i, table, z, &v0, &v1);
      _mm512_store_ps(buf + (i - start) * kPanelWidth, v0);
      _mm512_store_ps(buf + (i - start) * kPanelWidth + 16, v1);
    }
  }
}

// Up to 12 rows against a widened k range (whole blocks): 24 block sums, two weight vectors, one broadcast; the
// products accumulate in `sums` (L1) once per block.
template <int R>
__attribute__((target("avx512f"))) void Avx512WidenedBlocks(const Product& g, const Panel& p, const float* a,
                                                           const float* buf, int64_t start, int64_t stop,
                                                           float* sums) {
  for (int64_t first = start; first < stop; first += g.block) {
    const int64_t b = first / g.block, last = std::min(stop, first + g.block);
    __m512 blk[R][2];
    for (int r = 0; r < R; ++r) blk[r][0] = blk[r][1] = _mm512_setzero_ps();
    for (int64_t i = first; i < last; ++i) {
      const __m512 w0 = _mm512_load_ps(buf + (i - start) * kPanelWidth);
      const __m512 w1 = _mm512_load_ps(buf + (i - start) * kPanelWidth + 16);
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_set1_ps(a[r * g.lda + i]);
        blk[r][0] = _mm512_fmadd_ps(x, w0, blk[r][0]);
        blk[r][1] = _mm512_fmadd_ps(x, w1, blk[r][1]);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m512 scale = _mm512_loadu_ps(p.scales + b * kPanelWidth + 16 * h);
      for (int r = 0; r < R; ++r) {
        float* acc = sums + r * kPanelWidth + 16 * h;
        _mm512_storeu_ps(acc, _mm512_fmadd_ps(blk[r][h], scale, _mm512_loadu_ps(acc)));
      }
    }
  }
}

// Code row i as four vectors of 8 columns of float(code - zero), z[q] the zero points of columns 8q..8q+7.
template <PanelFormat F>
__attribute__((target("avx2,fma"), always_inline)) inline void Avx2Codes(const uint8_t* codes, int64_t i,
                                                                         const __m256i* z, __m256* v) {
  if constexpr (F == PanelFormat::kUint8) {
    const uint8_t* row = codes + i * kRowBytesU8;
    for (int q = 0; q < 4; ++q) {
      const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 8 * q)));
      v[q] = _mm256_cvtepi32_ps(_mm256_sub_epi32(c, z[q]));
    }
  } else {  // bytes 0..7: columns 0..7 (low nibbles) and 16..23 (high); bytes 8..15: 8..15 and 24..31
    const uint8_t* row = codes + i * kRowBytesU4;
    for (int half = 0; half < 2; ++half) {
      const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 8 * half)));
      v[half] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(bytes, _mm256_set1_epi32(0x0F)), z[half]));
      v[half + 2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bytes, 4), z[half + 2]));
    }
  }
}

template <PanelFormat F>
__attribute__((target("avx2,fma"))) void Avx2Widen(const Product& g, const Panel& p, int64_t start, int64_t stop,
                                                  float* buf) {
  constexpr int64_t kRowBytes = F == PanelFormat::kUint8 ? kRowBytesU8 : kRowBytesU4;
  for (int64_t first = start; first < stop; first += g.block) {
    __m256i z[4];
    for (int q = 0; q < 4; ++q)
      z[q] = p.zeros ? _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                           reinterpret_cast<const __m128i*>(p.zeros + (first / g.block) * kPanelWidth + 8 * q)))
                     : _mm256_set1_epi32(g.zu);
    for (int64_t i = first; i < std::min(stop, first + g.block); ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(p.codes + i * kRowBytes + kPrefetchBytes), _MM_HINT_T0);
      __m256 v[4];
      Avx2Codes<F>(p.codes, i, z, v);
      for (int q = 0; q < 4; ++q) _mm256_store_ps(buf + (i - start) * kPanelWidth + 8 * q, v[q]);
    }
  }
}

// Up to 3 rows against a widened k range: 12 block sums of 8 columns, one weight vector and R broadcasts.
template <int R>
__attribute__((target("avx2,fma"))) void Avx2WidenedBlocks(const Product& g, const Panel& p, const float* a,
                                                          const float* buf, int64_t start, int64_t stop, float* sums) {
  for (int64_t first = start; first < stop; first += g.block) {
    const int64_t b = first / g.block, last = std::min(stop, first + g.block);
    __m256 blk[R][4];
    for (int r = 0; r < R; ++r)
      for (int q = 0; q < 4; ++q) blk[r][q] = _mm256_setzero_ps();
    for (int64_t i = first; i < last; ++i) {
      __m256 x[R];
      for (int r = 0; r < R; ++r) x[r] = _mm256_broadcast_ss(a + r * g.lda + i);
      for (int q = 0; q < 4; ++q) {
        const __m256 w = _mm256_load_ps(buf + (i - start) * kPanelWidth + 8 * q);
        for (int r = 0; r < R; ++r) blk[r][q] = _mm256_fmadd_ps(x[r], w, blk[r][q]);
      }
    }
    for (int q = 0; q < 4; ++q) {
      const __m256 scale = _mm256_loadu_ps(p.scales + b * kPanelWidth + 8 * q);
      for (int r = 0; r < R; ++r) {
        float* acc = sums + r * kPanelWidth + 8 * q;
        _mm256_storeu_ps(acc, _mm256_fmadd_ps(blk[r][q], scale, _mm256_loadu_ps(acc)));
      }
    }
  }
}
#endif

}  // namespace quant
}  // namespace ndp
