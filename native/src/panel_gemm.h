// Matrix products against expert weights packed once, at compile time, into column panels.
//
// Why: an expert sees few tokens per call (top-k routing spreads a batch over the experts), so its products are
// a handful of rows against a whole weight matrix. A BLAS SGEMM packs the weight matrix on every call, which at
// a few rows costs as much memory traffic as the product itself; the weights never change, so they are packed
// here once and every product streams each panel from memory exactly once per block of rows.
//
// Layout: panel p holds columns [p * kPanelWidth, (p + 1) * kPanelWidth) of the K x N (x @ W) matrix as K rows of
// kPanelWidth contiguous floats; the last panel is zero padded. Each output element is a sum over k in increasing
// order, accumulated in one register lane, so a product does not depend on threads or on how rows are blocked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

namespace ndp {

constexpr int64_t kPanelWidth = 32;

// Cache-line (and AVX-512 vector) aligned storage, so every panel row is one aligned load.
template <typename T>
struct AlignedAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlignment)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlignment); }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const AlignedAllocator<U>&) const { return false; }
};
using AlignedFloats = std::vector<float, AlignedAllocator<float>>;

class PackedMatrix {
 public:
  // Packs the row-major K x N matrix w (row stride ld >= N).
  void Pack(const float* w, int64_t k, int64_t n, int64_t ld);
  int64_t rows() const { return k_; }
  int64_t cols() const { return n_; }
  size_t bytes() const { return data_.size() * sizeof(float); }
  const float* panel(int64_t p) const { return data_.data() + p * k_ * kPanelWidth; }
  int64_t panel_count() const { return (n_ + kPanelWidth - 1) / kPanelWidth; }

 private:
  int64_t k_ = 0, n_ = 0;
  AlignedFloats data_;
};

// The instruction sets PanelGemm has kernels for. All sum over k in the same order; the AVX kernels fuse each
// multiply-add (one rounding), the portable one only where its compiler targets FMA, so it may differ in the last
// bits.
enum class PanelIsa { kAvx512, kAvx2, kPortable };
const char* PanelIsaName(PanelIsa isa);  // "avx512f", "avx2", "portable"

// The environment variable that picks a kernel other than the CPU's best (tests and comparisons): one of the names
// above, or unset/empty for the best.
constexpr const char* kKernelIsaEnv = "NDP_EP_KERNEL_ISA";

// The kernel for `requested` (the variable's value; null or empty: this CPU's best). Returns an error message for
// an unknown name or one this CPU cannot run, else "".
std::string ChoosePanelIsa(const char* requested, PanelIsa* out);

// c[m x N] (row stride ldc) = a[m x K] (row stride lda) @ b, or c += that product when `accumulate` (the sum is
// formed first, then added to c, as an SGEMM with beta 1 does).
void PanelGemm(PanelIsa isa, int64_t m, const float* a, int64_t lda, const PackedMatrix& b, float* c, int64_t ldc,
               bool accumulate);

}  // namespace ndp
