// A self-contained check of the panel kernels and the element conversions, for a CPU the Python test suite cannot
// run on: benchmarks/check_cross_build.py cross-compiles it (with panel_gemm.cc and float_convert.cc) for another
// architecture and runs it under an emulator. On x86 tests/ep/test_panel_kernels.py covers the same ground through
// the provider.
//
// Every product of every weight format (float32, float16, bfloat16, 8-bit and 4-bit block-quantized codes with zero
// points), at shapes crossing the kernels' blocking edges, against a double-precision sum of the same widened
// weights; int8 rows against 8- and 4-bit codes (the integer path), against the blocks' exact integer dot products; the accumulate form; a column range of panels; float16 and bfloat16 conversions against values they
// must give; and the kernel choice (this CPU's best, an unknown name refused). Prints one line per failure and a
// summary; exits 1 on any failure.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <map>
#include <tuple>
#include <string>
#include <vector>

#include "float_convert.h"
#include "panel_gemm.h"

namespace {

int g_failures = 0;

void Fail(const std::string& what) {
  if (++g_failures <= 20) std::printf("FAIL %s\n", what.c_str());
}

struct Random {  // a fixed-seed 64-bit LCG: the same cases on every machine
  uint64_t state = 0x9E3779B97F4A7C15ull;
  uint32_t Next() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  }
  float Uniform() { return static_cast<float>(Next() % 2000001) / 1000000.0f - 1.0f; }  // [-1, 1]
};

enum class Kind { kFloat32, kFloat16, kBFloat16, kUint8, kUint4 };
const char* KindName(Kind kind) {
  static const char* names[] = {"float32", "float16", "bfloat16", "uint8", "uint4"};
  return names[static_cast<int>(kind)];
}

// Random `bits`-bit codes of a K x N matrix ([K][N]) with per-block zero points and scales ([blocks][N]).
struct QuantizedCodes {
  std::vector<uint8_t> codes, zeros;
  std::vector<float> scales;
};

QuantizedCodes RandomCodes(int bits, int64_t k, int64_t n, int64_t block, Random& random) {
  const int64_t blocks = (k + block - 1) / block;
  QuantizedCodes q{std::vector<uint8_t>(static_cast<size_t>(k * n)), std::vector<uint8_t>(static_cast<size_t>(blocks * n)),
                   std::vector<float>(static_cast<size_t>(blocks * n))};
  for (auto& code : q.codes) code = static_cast<uint8_t>(random.Next() % (1u << bits));
  for (auto& zero : q.zeros) zero = static_cast<uint8_t>(random.Next() % (1u << bits));
  for (auto& scale : q.scales) scale = 0.01f + 0.05f * std::fabs(random.Uniform());
  return q;
}

// A K x N weight matrix in one format, with each element's widened float value (what the kernels must multiply).
struct Weights {
  ndp::PackedMatrix packed;
  std::vector<float> widened;  // [K][N]
};

Weights MakeWeights(Kind kind, int64_t k, int64_t n, int64_t block, Random& random) {
  Weights w;
  w.widened.resize(static_cast<size_t>(k * n));
  if (kind == Kind::kFloat32 || kind == Kind::kFloat16 || kind == Kind::kBFloat16) {
    std::vector<uint32_t> raw(static_cast<size_t>(k * n));
    for (int64_t i = 0; i < k * n; ++i) {
      const float value = random.Uniform();
      if (kind == Kind::kFloat32) {
        w.widened[i] = value;
      } else {
        const uint16_t bits = kind == Kind::kFloat16 ? ndp::FloatToHalf(value) : ndp::FloatToBFloat16(value);
        raw[i] = bits;
        w.widened[i] = kind == Kind::kFloat16 ? ndp::HalfToFloat(bits) : ndp::BFloat16ToFloat(bits);
      }
    }
    if (kind == Kind::kFloat32) {
      w.packed.PackFloat(ndp::PanelFormat::kFloat32, k, n, [&](int64_t i, int64_t j) { return w.widened[i * n + j]; });
    } else {
      const auto format = kind == Kind::kFloat16 ? ndp::PanelFormat::kFloat16 : ndp::PanelFormat::kBFloat16;
      w.packed.PackFloat(format, k, n, [&](int64_t i, int64_t j) { return static_cast<uint16_t>(raw[i * n + j]); });
    }
    return w;
  }
  const int bits = kind == Kind::kUint8 ? 8 : 4;
  const QuantizedCodes q = RandomCodes(bits, k, n, block, random);
  const auto& codes = q.codes;
  const auto& zeros = q.zeros;
  const auto& scales = q.scales;
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t b = i / block;
      w.widened[i * n + j] =
          static_cast<float>(static_cast<int>(codes[i * n + j]) - static_cast<int>(zeros[b * n + j])) * scales[b * n + j];
    }
  }
  w.packed.PackQuantized(
      bits, block, k, n, [&](int64_t i, int64_t j) { return codes[i * n + j]; },
      [&](int64_t b, int64_t j) { return scales[b * n + j]; }, [&](int64_t b, int64_t j) { return zeros[b * n + j]; });
  return w;
}

// c = a @ w (plus c's values when accumulating), for columns [first, end), checked element by element against a
// double sum of the widened weights: within 1e-5 of the sum of |a * w| (float32 accumulation over at most 520 terms).
void CheckProduct(ndp::PanelIsa isa, Kind kind, int64_t m, int64_t k, int64_t n, int64_t block, bool accumulate,
                  int64_t first_panel, int64_t end_panel, Random& random) {
  const Weights w = MakeWeights(kind, k, n, block, random);
  const int64_t lda = k + 3, ldc = n + 5;  // row strides wider than the rows
  std::vector<float> a(static_cast<size_t>(m * lda)), c(static_cast<size_t>(m * ldc));
  for (auto& value : a) value = random.Uniform();
  for (auto& value : c) value = random.Uniform();
  const std::vector<float> before = c;
  ndp::PanelGemm(isa, m, a.data(), lda, w.packed, c.data(), ldc, accumulate, first_panel, end_panel);
  const int64_t panels = w.packed.panel_count();
  const int64_t last = end_panel < 0 || end_panel > panels ? panels : end_panel;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const bool computed = j >= first_panel * ndp::kPanelWidth && j < last * ndp::kPanelWidth;
      const float got = c[i * ldc + j];
      if (!computed) {
        if (got != before[i * ldc + j]) Fail(std::string(KindName(kind)) + ": a column outside the panels changed");
        continue;
      }
      double sum = 0, magnitude = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double term = static_cast<double>(a[i * lda + p]) * w.widened[p * n + j];
        sum += term;
        magnitude += std::fabs(term);
      }
      if (accumulate) {
        sum += before[i * ldc + j];
        magnitude += std::fabs(before[i * ldc + j]);
      }
      if (!(std::fabs(got - sum) <= 1e-5 * magnitude + 1e-30)) {
        char line[256];
        std::snprintf(line, sizeof line, "%s m=%lld k=%lld n=%lld block=%lld accumulate=%d [%lld,%lld]: %.9g vs %.9g",
                      KindName(kind), static_cast<long long>(m), static_cast<long long>(k),
                      static_cast<long long>(n), static_cast<long long>(block), accumulate ? 1 : 0,
                      static_cast<long long>(i), static_cast<long long>(j), got, sum);
        Fail(line);
        return;
      }
    }
  }
}

// c = int8 rows @ codes (PanelGemmInt8, a kInt8Quads matrix of `bits`-bit codes), against the double sum over blocks
// of row scale * weight scale * the integer dot product of q with (code - zero point).
void CheckInt8Product(ndp::PanelIsa isa, int bits, int64_t m, int64_t k, int64_t n, int64_t block, bool accumulate,
                      Random& random) {
  const int64_t blocks = (k + block - 1) / block;
  const QuantizedCodes weights = RandomCodes(bits, k, n, block, random);
  const auto& codes = weights.codes;
  const auto& zeros = weights.zeros;
  const auto& scales = weights.scales;
  ndp::PackedMatrix packed;
  packed.PackQuantized(
      bits, block, k, n, [&](int64_t i, int64_t j) { return codes[i * n + j]; },
      [&](int64_t b, int64_t j) { return scales[b * n + j]; }, [&](int64_t b, int64_t j) { return zeros[b * n + j]; },
      true);
  ndp::Int8RowsBuffer rows;
  rows.Resize(m, k, block);
  std::fill(rows.q.begin(), rows.q.end(), 0);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      int32_t sum = 0;
      for (int64_t i = b * block; i < std::min(k, (b + 1) * block); ++i) {
        const auto value = static_cast<int8_t>(static_cast<int32_t>(random.Next() % 255) - 127);  // -127..127
        rows.q[r * rows.ldq + i] = value;
        sum += value;
      }
      rows.sums[r * rows.lds + b] = sum;
      rows.scales[r * rows.lds + b] = 0.001f + 0.01f * std::fabs(random.Uniform());
    }
  }
  const int64_t ldc = n + 3;
  std::vector<float> c(static_cast<size_t>(m * ldc));
  for (auto& value : c) value = random.Uniform();
  const std::vector<float> before = c;
  ndp::PanelGemmInt8(isa, m, rows.View(), packed, c.data(), ldc, accumulate);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = accumulate ? before[r * ldc + j] : 0.0, magnitude = std::fabs(sum);
      for (int64_t b = 0; b < blocks; ++b) {
        int64_t dot = 0;
        for (int64_t i = b * block; i < std::min(k, (b + 1) * block); ++i)
          dot += int64_t{rows.q[r * rows.ldq + i]} * (int64_t{codes[i * n + j]} - zeros[b * n + j]);
        const double term = static_cast<double>(dot) * rows.scales[r * rows.lds + b] * scales[b * n + j];
        sum += term;
        magnitude += std::fabs(term);
      }
      const float got = c[r * ldc + j];
      if (!(std::fabs(got - sum) <= 1e-5 * magnitude + 1e-30)) {
        char line[256];
        std::snprintf(line, sizeof line, "int8 rows x %d-bit codes m=%lld k=%lld n=%lld block=%lld [%lld,%lld]: %.9g vs %.9g",
                      bits, static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n),
                      static_cast<long long>(block), static_cast<long long>(r), static_cast<long long>(j), got, sum);
        Fail(line);
        return;
      }
    }
  }
}

void CheckConversions() {
  const struct {
    uint16_t half;
    float value;
  } halves[] = {{0x3C00, 1.0f},       {0xC000, -2.0f},          {0x7BFF, 65504.0f},
                {0x0001, 0x1p-24f},   {0x03FF, 0x1.ff8p-15f},   {0x3555, 0x1.554p-2f}};
  for (const auto& h : halves) {
    if (ndp::HalfToFloat(h.half) != h.value) Fail("HalfToFloat of a known value");
    if (ndp::FloatToHalf(h.value) != h.half) Fail("FloatToHalf of a known value");
  }
  if (!std::isinf(ndp::HalfToFloat(0x7C00)) || !std::isnan(ndp::HalfToFloat(0x7E00))) Fail("half infinity / NaN");
  if (ndp::FloatToHalf(1e6f) != 0x7C00) Fail("FloatToHalf overflow to infinity");
  if (ndp::FloatToHalf(1.0f + 0x1p-11f) != 0x3C00 || ndp::FloatToHalf(1.0f + 3 * 0x1p-11f) != 0x3C02)
    Fail("FloatToHalf rounds to nearest even");
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {  // every finite half survives the round trip
    const auto half = static_cast<uint16_t>(bits);
    if ((half & 0x7C00) == 0x7C00) continue;
    if (ndp::FloatToHalf(ndp::HalfToFloat(half)) != half) {
      Fail("half round trip");
      break;
    }
  }
  if (ndp::BFloat16ToFloat(0x3F80) != 1.0f || ndp::FloatToBFloat16(1.0f) != 0x3F80) Fail("bfloat16 of 1");
  if (ndp::FloatToBFloat16(1.0f + 0x1p-8f) != 0x3F80 || ndp::FloatToBFloat16(1.0f + 3 * 0x1p-8f) != 0x3F82)
    Fail("FloatToBFloat16 rounds to nearest even");
}

}  // namespace

// PackQuantizedRows (codes as stored rows, as the kernel loads them) gives the bytes PackQuantized gives from the
// same codes read one by one; with a uniform zero point, the zero points every panel reads are that one.
void CheckRowPacking(int bits, bool int8_rows, bool uniform_zero, int64_t k, int64_t n, int64_t block,
                     Random& random) {
  const int64_t row_bytes = (k * bits + 7) / 8, blocks = (k + block - 1) / block;
  std::vector<uint8_t> rows(static_cast<size_t>(n * row_bytes));
  for (auto& byte : rows) byte = static_cast<uint8_t>(random.Next());
  std::vector<float> scales(static_cast<size_t>(n * blocks));
  for (auto& value : scales) value = random.Uniform();
  std::vector<uint8_t> zeros(scales.size());
  for (auto& value : zeros) value = uniform_zero ? 8 : static_cast<uint8_t>(random.Next() % (1u << bits));
  auto code = [&](int64_t i, int64_t j) {
    const uint8_t* row = rows.data() + j * row_bytes;
    return bits == 8 ? row[i] : static_cast<uint8_t>((i & 1) ? row[i >> 1] >> 4 : row[i >> 1] & 0x0F);
  };
  auto scale = [&](int64_t b, int64_t j) { return scales[static_cast<size_t>(j * blocks + b)]; };
  auto zero = [&](int64_t b, int64_t j) { return zeros[static_cast<size_t>(j * blocks + b)]; };
  ndp::PackedMatrix one, two;
  one.PackQuantized(bits, block, k, n, code, scale, zero, int8_rows);
  two.PackQuantizedRows(bits, block, k, n, rows.data(), row_bytes, scale, zero, int8_rows, uniform_zero);
  const std::string what = "row packing bits " + std::to_string(bits) + (int8_rows ? " int8 rows" : "") +
                           (uniform_zero ? " uniform zero" : "") + " k " + std::to_string(k) + " n " +
                           std::to_string(n) + " block " + std::to_string(block);
  const size_t panel_bytes = static_cast<size_t>(one.PanelRows() * ndp::PackedMatrix::RowBytes(one.format()));
  for (int64_t p = 0; p < one.panel_count(); ++p) {
    if (std::memcmp(one.panel(p), two.panel(p), panel_bytes) != 0) Fail(what + ": codes of panel " + std::to_string(p));
    const size_t count = static_cast<size_t>(blocks * ndp::kPanelWidth);
    if (std::memcmp(one.scales(p), two.scales(p), count * sizeof(float)) != 0) Fail(what + ": scales");
    const int64_t width = std::min(ndp::kPanelWidth, n - p * ndp::kPanelWidth);
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t j = 0; j < width; ++j)
        if (one.zeros(p)[b * ndp::kPanelWidth + j] != two.zeros(p)[b * ndp::kPanelWidth + j]) Fail(what + ": zeros");
  }
  if (uniform_zero && two.bytes() >= one.bytes() && one.panel_count() > 1) Fail(what + ": zero points not shared");
  // scales kept where they are (N rows of `blocks` floats) multiply to the same bits as copied ones
  ndp::PackedMatrix kept;
  static int drops = 0;
  drops = 0;
  kept.PackQuantizedRows(bits, block, k, n, rows.data(), row_bytes, scale, zero, int8_rows, uniform_zero,
                         scales.data(), blocks, [](const void*, size_t) { ++drops; });
  const auto copied_scale_bytes = static_cast<size_t>(two.panel_count() * blocks * ndp::kPanelWidth) * sizeof(float);
  if (!kept.scales_pending() || kept.bytes() + copied_scale_bytes != two.bytes() || drops != 0)
    Fail(what + ": scales copied before the first product");
  ndp::PanelIsa isa;
  ndp::ChoosePanelIsa(nullptr, &isa);
  const int64_t m = 3;
  std::vector<float> copied(static_cast<size_t>(m * n)), in_place(copied.size());
  if (int8_rows) {
    ndp::Int8RowsBuffer a;
    a.Resize(m, k, block);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t sum = 0;
        for (int64_t i = b * block; i < std::min(k, (b + 1) * block); ++i) {
          const auto q = static_cast<int8_t>(static_cast<int>(random.Next() % 255) - 127);
          a.q[static_cast<size_t>(r * a.ldq + i)] = q;
          sum += q;
        }
        a.scales[static_cast<size_t>(r * a.lds + b)] = random.Uniform();
        a.sums[static_cast<size_t>(r * a.lds + b)] = sum;
      }
    }
    ndp::PanelGemmInt8(isa, m, a.View(), two, copied.data(), n, false);
    ndp::PanelGemmInt8(isa, m, a.View(), kept, in_place.data(), n, false);
  } else {
    std::vector<float> a(static_cast<size_t>(m * k));
    for (auto& value : a) value = random.Uniform();
    ndp::PanelGemm(isa, m, a.data(), k, two, copied.data(), n, false);
    ndp::PanelGemm(isa, m, a.data(), k, kept, in_place.data(), n, false);
  }
  if (std::memcmp(copied.data(), in_place.data(), copied.size() * sizeof(float)) != 0)
    Fail(what + ": kept scales give other products");
  if (kept.scales_pending() || kept.bytes() != two.bytes() || drops != 1)
    Fail(what + ": kept scales not copied (and their source dropped) once by the first product");
}

// Quantized products of codes packed as stored rows, with one zero point for every block (the 4-bit kernels' table
// lookup) or varying ones: within tolerance of a double sum of the widened weights, and every row with the bits of
// that row multiplied alone (1-4 rows stream the codes over up to four panels at a time, more rows multiply a
// widened panel), whatever the kernel: AVX-512 and AVX2 give the same bits (`first`, filled by the first vector
// kernel to run).
void CheckQuantizedRows(ndp::PanelIsa isa, int bits, bool uniform_zero, int64_t m, int64_t k, int64_t n,
                        int64_t block, Random& random, std::vector<float>* first) {
  const int64_t row_bytes = (k * bits + 7) / 8, blocks = (k + block - 1) / block;
  Random fixed;  // the same weights and rows for every kernel
  fixed.state ^= static_cast<uint64_t>(bits * 1000003 + k * 101 + n * 7 + block + (uniform_zero ? 1 : 0));
  std::vector<uint8_t> rows(static_cast<size_t>(n * row_bytes));
  for (auto& byte : rows) byte = static_cast<uint8_t>(fixed.Next());
  std::vector<float> scales(static_cast<size_t>(n * blocks));
  for (auto& value : scales) value = 0.01f + 0.05f * std::fabs(fixed.Uniform());
  std::vector<uint8_t> zeros(scales.size());
  for (auto& value : zeros) value = static_cast<uint8_t>(uniform_zero ? 1 << (bits - 1) : fixed.Next() % (1u << bits));
  auto code = [&](int64_t i, int64_t j) {
    const uint8_t* row = rows.data() + j * row_bytes;
    return bits == 8 ? row[i] : static_cast<uint8_t>((i & 1) ? row[i >> 1] >> 4 : row[i >> 1] & 0x0F);
  };
  ndp::PackedMatrix w;
  w.PackQuantizedRows(
      bits, block, k, n, rows.data(), row_bytes, [&](int64_t b, int64_t j) { return scales[j * blocks + b]; },
      [&](int64_t b, int64_t j) { return zeros[j * blocks + b]; }, false, uniform_zero);
  std::vector<float> a(static_cast<size_t>(m * k)), c(static_cast<size_t>(m * n)), alone(static_cast<size_t>(n));
  for (auto& value : a) value = fixed.Uniform();
  ndp::PanelGemm(isa, m, a.data(), k, w, c.data(), n, false);
  char what[160];
  std::snprintf(what, sizeof what, "%s %d-bit%s m=%lld k=%lld n=%lld block=%lld", ndp::PanelIsaName(isa), bits,
                uniform_zero ? " uniform zero" : "", static_cast<long long>(m), static_cast<long long>(k),
                static_cast<long long>(n), static_cast<long long>(block));
  for (int64_t r = 0; r < m; ++r) {
    ndp::PanelGemm(isa, 1, a.data() + r * k, k, w, alone.data(), n, false);
    if (isa != ndp::PanelIsa::kPortable && std::memcmp(alone.data(), c.data() + r * n, sizeof(float) * n) != 0)
      return Fail(std::string(what) + ": a row alone gives other bits");
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double weight = (static_cast<int>(code(i, j)) - static_cast<int>(zeros[j * blocks + i / block])) *
                              static_cast<double>(scales[j * blocks + i / block]);
        sum += a[r * k + i] * weight;
        magnitude += std::fabs(a[r * k + i] * weight);
      }
      if (!(std::fabs(c[r * n + j] - sum) <= 1e-5 * magnitude + 1e-30)) return Fail(std::string(what) + ": a sum");
    }
  }
  if (isa == ndp::PanelIsa::kPortable) return;
  if (first->empty()) {
    *first = c;
  } else if (*first != c) {
    Fail(std::string(what) + ": other bits than the first vector kernel");
  }
}

int main() {
  CheckConversions();
  Random packing;
  for (int bits : {8, 4})
    for (bool int8_rows : {false, true})
      for (bool uniform_zero : {false, true})
        for (int64_t k : {32, 90, 352})
          for (int64_t n : {2, 32, 70}) CheckRowPacking(bits, int8_rows, uniform_zero, k, n, 32, packing);
  ndp::PanelIsa best;
  const std::string chosen = ndp::ChoosePanelIsa(nullptr, &best);
  if (!chosen.empty()) Fail("no kernel for this CPU: " + chosen);
  ndp::PanelIsa unused;
  if (ndp::ChoosePanelIsa("sse9", &unused).find("must be avx512f, avx2 or portable") == std::string::npos)
    Fail("an unknown kernel name is not refused");
  Random random;
  std::string ran;
  int cases = 0;
  std::map<std::tuple<int, bool, int64_t, int64_t, int64_t, int64_t>, std::vector<float>> vector_bits;
  const Kind kinds[] = {Kind::kFloat32, Kind::kFloat16, Kind::kBFloat16, Kind::kUint8, Kind::kUint4};
  for (const char* name : {"avx512f", "avx2", "portable"}) {  // every kernel this CPU runs
    ndp::PanelIsa isa;
    if (!ndp::ChoosePanelIsa(name, &isa).empty()) continue;
    ran += std::string(ran.empty() ? "" : ", ") + name + (isa == best ? " (best)" : "");
    for (Kind kind : kinds) {
      const bool quantized = kind == Kind::kUint8 || kind == Kind::kUint4;
      for (int64_t m : {1, 4, 5, 13}) {
        for (int64_t k : {2, 34, 300, 520}) {  // within, across and beyond a 256-deep k slice
          for (int64_t n : {2, 32, 70}) {       // a part panel, one panel, two and a part
            for (int64_t block : quantized ? std::vector<int64_t>{16, 32, 300} : std::vector<int64_t>{0}) {
              for (bool accumulate : {false, true}) {
                CheckProduct(isa, kind, m, k, n, block, accumulate, 0, -1, random);
                ++cases;
              }
            }
          }
        }
      }
      CheckProduct(isa, kind, 5, 64, 100, quantized ? 32 : 0, false, 1, 3, random);  // only panels 1 and 2
      ++cases;
    }
    for (int bits : {8, 4})
      for (bool uniform_zero : {true, false})
        for (int64_t m : {1, 2, 3, 4, 13})
          for (int64_t k : {34, 300})
            for (int64_t n : {2, 70, 130, 200})  // 1, 3, 5 and 7 panels: streams of 4 and the rest
              for (int64_t block : {16, 32, 300}) {
                std::vector<float>& first = vector_bits[{bits, uniform_zero, m, k, n, block}];
                CheckQuantizedRows(isa, bits, uniform_zero, m, k, n, block, random, &first);
                ++cases;
              }
    for (int bits : {8, 4}) {
      for (int64_t m : {1, 5, 7, 13}) {        // row blocks of 6, 4 and 1, and short last ones
        for (int64_t k : {32, 90, 352}) {       // whole blocks, a part block ending mid-quad
          for (int64_t n : {2, 32, 70}) {
            for (int64_t block : {16, 32, 256}) {
              CheckInt8Product(isa, bits, m, k, n, block, m == 5, random);
              ++cases;
            }
          }
        }
      }
    }
  }
  std::printf("panel kernels %s: %d products; conversions and kernel choice checked: %s\n", ran.c_str(), cases,
              g_failures ? "FAILED" : "ok");
  return g_failures ? 1 : 0;
}
