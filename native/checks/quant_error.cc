// The error of PanelGemm's block-quantized products against a float64 sum of the exactly dequantized weights
// ((code - zero point) * scale in double): the RMS error over the RMS output, and the largest error over the sum of
// the terms' magnitudes, for int4/int8 codes with one zero point or varying ones, 1 and 64 rows, K 2048 and 1792
// (LFM2's gate/up and down depths), blocks of 32. Not part of the build or the tests:
//
//   g++ -std=c++17 -O2 -Inative/src native/checks/quant_error.cc native/src/panel_gemm.cc native/src/float_convert.cc
//       -o /tmp/quant_error && [NDP_EP_KERNEL_ISA=avx2] /tmp/quant_error
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>
#include "panel_gemm.h"
using namespace ndp;
int main() {
  PanelIsa isa; if (!ChoosePanelIsa(getenv(kKernelIsaEnv), &isa).empty()) return 1;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (int bits : {4, 8}) for (bool uniform : {true, false}) for (int64_t k : {2048, 1792}) for (int m : {1, 64}) {
    const int64_t n = 512, block = 32, blocks = k / block;
    std::vector<uint8_t> codes(n * k * bits / 8);
    for (auto& c : codes) c = rng();
    std::vector<float> scales(n * blocks); for (auto& s : scales) s = 0.02f * (0.5f + std::fabs(normal(rng)));
    std::vector<uint8_t> zeros(n * blocks); for (auto& z : zeros) z = uniform ? (1 << (bits - 1)) : rng() % (1 << bits);
    auto code = [&](int64_t i, int64_t j) { const uint8_t* row = codes.data() + j * (k * bits / 8);
      return bits == 8 ? row[i] : ((i & 1) ? row[i >> 1] >> 4 : row[i >> 1] & 15); };
    PackedMatrix w;
    w.PackQuantizedRows(bits, block, k, n, codes.data(), k * bits / 8, [&](int64_t b, int64_t j) { return scales[j * blocks + b]; },
                        [&](int64_t b, int64_t j) { return zeros[j * blocks + b]; }, false, uniform);
    std::vector<float> a(m * k), c(m * n);
    for (auto& x : a) x = normal(rng);
    PanelGemm(isa, m, a.data(), k, w, c.data(), n, false);
    double max_rel = 0, sum_sq = 0, ref_sq = 0;
    for (int r = 0; r < m; ++r) for (int64_t j = 0; j < n; ++j) {
      double sum = 0, mag = 0;
      for (int64_t i = 0; i < k; ++i) { double t = double(a[r * k + i]) * ((int(code(i, j)) - int(zeros[j * blocks + i / block])) * double(scales[j * blocks + i / block])); sum += t; mag += std::fabs(t); }
      double e = c[r * n + j] - sum; sum_sq += e * e; ref_sq += sum * sum; max_rel = std::max(max_rel, std::fabs(e) / mag);
    }
    printf("int%d %s k=%ld m=%2d: rms error / rms output %.3e   max |error| / sum|terms| %.3e\n", bits, uniform ? "uniform zero" : "zero points ", k, m, std::sqrt(sum_sq / ref_sq), max_rel);
  }
}
