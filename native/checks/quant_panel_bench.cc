// Microbenchmark of PanelGemm on block-quantized panels at LFM2-8B-A1B's expert widths (gate/up 2048 x 3584, down
// 1792 x 2048, blocks of 32, no zero points), one thread. Not part of the build or the tests:
//
//   g++ -std=c++17 -O3 -Inative/src native/checks/quant_panel_bench.cc native/src/panel_gemm.cc
//       native/src/float_convert.cc -o /tmp/quant_panel_bench
//   [NDP_EP_KERNEL_ISA=avx2] [COPIES=24] [ROWS=1,2,4,16,64] /tmp/quant_panel_bench [4|8]
//
// COPIES packed copies of each matrix are cycled through (24: 88 MB of int4 codes, the bytes a 1-token step of a
// 4-layer top-4 chain reads, more than the caches hold; 1: cache resident). Prints the best of 5 timings of the
// thread's CPU time (steadier than wall time on a shared machine), as GB/s of packed weights and GFLOP/s.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "panel_gemm.h"

namespace {
double ThreadSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
}  // namespace

int main(int argc, char** argv) {
  ndp::PanelIsa isa;
  const std::string error = ndp::ChoosePanelIsa(std::getenv(ndp::kKernelIsaEnv), &isa);
  if (!error.empty()) return std::puts(error.c_str()), 1;
  const int bits = argc > 1 ? std::atoi(argv[1]) : 4;
  const int copies = std::getenv("COPIES") ? std::atoi(std::getenv("COPIES")) : 24;
  std::vector<int> row_counts = {1, 2, 4, 16, 64};
  if (const char* rows = std::getenv("ROWS")) {
    row_counts.clear();
    std::string text = rows;
    for (size_t start = 0; start <= text.size();) {
      const size_t end = std::min(text.find(',', start), text.size());
      row_counts.push_back(std::atoi(text.substr(start, end - start).c_str()));
      start = end + 1;
    }
  }
  const int64_t block = 32;
  uint32_t state = 1;
  auto next = [&] { return (state = state * 1664525u + 1013904223u) >> 8; };
  for (auto [k, n] : {std::pair<int64_t, int64_t>{2048, 3584}, {1792, 2048}}) {
    const int64_t blocks = (k + block - 1) / block, row_bytes = k * bits / 8;
    std::vector<uint8_t> codes(static_cast<size_t>(n * row_bytes));
    for (auto& c : codes) c = static_cast<uint8_t>(next());
    std::vector<float> scales(static_cast<size_t>(n * blocks));
    for (auto& s : scales) s = 0.01f + static_cast<float>(next() % 1000) * 1e-5f;
    std::vector<ndp::PackedMatrix> matrices(static_cast<size_t>(copies));
    for (auto& w : matrices)
      w.PackQuantizedRows(
          bits, block, k, n, codes.data(), row_bytes, [&](int64_t b, int64_t j) { return scales[j * blocks + b]; },
          [&](int64_t, int64_t) { return 1 << (bits - 1); }, false, true);
    for (int m : row_counts) {
      std::vector<float> a(static_cast<size_t>(m * k)), c(static_cast<size_t>(m * n));
      for (auto& x : a) x = static_cast<float>(next() % 2001) / 1000.0f - 1.0f;
      const int reps = m == 1 ? 200 : m <= 16 ? 60 : 20;
      for (int r = 0; r < 3; ++r) ndp::PanelGemm(isa, m, a.data(), k, matrices[r % copies], c.data(), n, false);
      double best = 1e30;
      for (int trial = 0; trial < 5; ++trial) {
        const double start = ThreadSeconds();
        for (int r = 0; r < reps; ++r) ndp::PanelGemm(isa, m, a.data(), k, matrices[r % copies], c.data(), n, false);
        best = std::min(best, (ThreadSeconds() - start) / reps);
      }
      std::printf("%s int%d k=%lld n=%lld rows=%2d: %8.1f us  %6.1f GB/s  %6.1f GFLOP/s\n", ndp::PanelIsaName(isa),
                  bits, static_cast<long long>(k), static_cast<long long>(n), m, best * 1e6,
                  static_cast<double>(matrices[0].bytes()) / best / 1e9, 2.0 * m * k * n / best / 1e9);
    }
  }
}
