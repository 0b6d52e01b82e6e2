// Matrix products against expert weights packed once, at compile time, into column panels, in their stored
// precision.
//
// Why: an expert sees few tokens per call (top-k routing spreads a batch over the experts), so its products are
// a handful of rows against a whole weight matrix. A BLAS SGEMM packs the weight matrix on every call, which at
// a few rows costs as much memory traffic as the product itself; the weights never change, so they are packed
// here once and every product streams each panel from memory exactly once per block of rows. Weights stay in the
// precision the model stores (float32, float16, bfloat16, or 8/4-bit block-quantized codes with their scales and
// zero points) and are widened to float32 in registers, so a float16 model takes half the memory of float32 and
// an int4 one about a sixth, and a decode step reads that much less.
//
// Layout: panel p holds columns [p * kPanelWidth, (p + 1) * kPanelWidth) of the K x N (x @ W) matrix as K rows of
// kPanelWidth values; the last panel is zero padded. A quantized panel also holds, per block of `block` rows, the
// 32 columns' scales (float32) and zero points. Every weight is widened exactly as a float32 copy made at load
// time would be (float16/bfloat16 exactly; a code as float(code - zero_point) * scale, one rounding), and each
// output element is a sum over k in increasing order in one register lane, so a product depends neither on the
// weights' storage nor on threads or on how rows are blocked.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

namespace ndp {

constexpr int64_t kPanelWidth = 32;

// Cache-line (and AVX-512 vector) aligned storage, so every float32 panel row is one aligned load.
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
using AlignedBytes = std::vector<uint8_t, AlignedAllocator<uint8_t>>;

// How a panel stores its values. kUint8 / kUint4: unsigned block-quantized codes, value (code - zero) * scale; a
// kUint4 panel row is 16 bytes, byte c holding column c in its low nibble and column c + 16 in its high one.
// kInt8Quads: the codes (8 or 4 bits) one byte each, for products with int8 rows (PanelGemmInt8): rows are taken four
// at a time, a quad of rows being kPanelWidth x 4 bytes (column j's four codes in bytes 4j..4j+3), the panel's K
// rows padded with zero codes to a multiple of four.
enum class PanelFormat { kFloat32, kFloat16, kBFloat16, kUint8, kUint4, kInt8Quads };

class PackedMatrix {
 public:
  // Packs the K x N matrix whose element (i, j) is value(i, j): a float for kFloat32, the raw 16 bits (uint16_t)
  // for kFloat16 / kBFloat16.
  template <typename Value>
  void PackFloat(PanelFormat format, int64_t k, int64_t n, Value value);
  // Packs a block-quantized K x N matrix of `bits` (8 or 4) bit codes: code(i, j), and scale(b, j) / zero(b, j)
  // for block b = i / block of rows; as kInt8Quads when `int8_rows` (then `block` is a multiple of 4). With
  // `uniform_zero` every zero point is `zero(0, 0)` (a model without zero points): one block row of them is kept
  // and shared by every panel instead of one byte per block and column.
  template <typename Code, typename Scale, typename Zero>
  void PackQuantized(int bits, int64_t block, int64_t k, int64_t n, Code code, Scale scale, Zero zero,
                     bool int8_rows = false, bool uniform_zero = false);

  // PackQuantized for codes stored as ONNX Runtime's QMoE and the sharded op store them: N rows of `row_bytes`
  // bytes, row j holding column j's K codes along the input (two 4-bit codes a byte, low nibble first). Gives the
  // same panels as PackQuantized with code(i, j) read from there, streaming each row once.
  // With `kept_scales` the scales are not copied now but on the matrix's first product (thread-safe, once), from
  // N rows of `scale_stride` float32 values (column j's scale of block b at kept_scales[j * scale_stride + b]),
  // memory that must outlive the matrix until then (a file mapping the kernel keeps), after which `drop` (when
  // set) is called on that memory; `scale` is then not called. A session so holds the scales of the experts runs
  // have routed to, as stock ONNX Runtime's QMoE (reading them from its file mapping) does; the products are the
  // same, bit for bit.
  using DropPages = void (*)(const void* data, size_t bytes);
  template <typename Scale, typename Zero>
  void PackQuantizedRows(int bits, int64_t block, int64_t k, int64_t n, const uint8_t* codes, int64_t row_bytes,
                         Scale scale, Zero zero, bool int8_rows = false, bool uniform_zero = false,
                         const float* kept_scales = nullptr, int64_t scale_stride = 0, DropPages drop = nullptr);

  PanelFormat format() const { return format_; }
  int64_t rows() const { return k_; }
  int64_t cols() const { return n_; }
  int64_t block() const { return block_; }  // rows per quantization block (0 for float formats)
  int64_t panel_count() const { return (n_ + kPanelWidth - 1) / kPanelWidth; }
  size_t bytes() const { return data_.size() + scales_.size() * sizeof(float) + zeros_.size(); }
  const uint8_t* panel(int64_t p) const { return data_.data() + p * PanelRows() * RowBytes(format_); }
  const float* scales(int64_t p) const {  // copied now, or on this first use (kept scales)
    if (lazy_) std::call_once(lazy_->once, [this] { CopyKeptScales(); });
    return scales_.data() + p * Blocks() * kPanelWidth;
  }
  bool uniform_zero() const { return uniform_zero_; }  // one zero point for every block and column: zeros(p)[0]
  bool scales_pending() const { return lazy_ != nullptr && scales_.empty(); }  // kept, not copied yet
  const uint8_t* zeros(int64_t p) const { return zeros_.data() + (uniform_zero_ ? 0 : p * Blocks() * kPanelWidth); }

  static int64_t RowBytes(PanelFormat format) {
    switch (format) {
      case PanelFormat::kFloat32:
        return kPanelWidth * 4;
      case PanelFormat::kFloat16:
      case PanelFormat::kBFloat16:
        return kPanelWidth * 2;
      case PanelFormat::kUint8:
      case PanelFormat::kInt8Quads:
        return kPanelWidth;
      default:
        return kPanelWidth / 2;
    }
  }
  // Rows a panel stores: K, padded to a multiple of 4 for kInt8Quads.
  int64_t PanelRows() const { return format_ == PanelFormat::kInt8Quads ? (k_ + 3) / 4 * 4 : k_; }

 private:
  void Allocate(PanelFormat format, int64_t k, int64_t n, int64_t block, bool uniform_zero = false,
                bool kept_scales = false);
  void CopyKeptScales() const;  // kept scales into scales_ (once, under lazy_->once), then dropped
  void PackCodeRows(int bits, const uint8_t* codes, int64_t row_bytes);  // the codes of PackQuantizedRows
  template <typename Scale, typename Zero>
  void PackBlockParameters(Scale scale, Zero zero, bool uniform_zero);
  int64_t Blocks() const { return block_ ? (k_ + block_ - 1) / block_ : 0; }

  PanelFormat format_ = PanelFormat::kFloat32;
  int64_t k_ = 0, n_ = 0, block_ = 0;
  AlignedBytes data_;
  mutable AlignedFloats scales_;  // [panel][block][kPanelWidth]; filled on first use from kept_scales_
  std::vector<uint8_t> zeros_;  // [panel][block][kPanelWidth], or [block][kPanelWidth] shared when uniform_zero_
  bool uniform_zero_ = false;
  struct Lazy {
    std::once_flag once;
  };
  std::unique_ptr<Lazy> lazy_;          // set while the scales are kept (PackQuantizedRows' kept_scales)
  const float* kept_scales_ = nullptr;  // their source, valid until copied
  int64_t scale_stride_ = 0;
  DropPages drop_ = nullptr;
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
// formed first, then added to c, as an SGEMM with beta 1 does). Only the columns of panels [first_panel,
// end_panel) are computed (end_panel -1 or past the last: through the last); c points at column 0 either way.
void PanelGemm(PanelIsa isa, int64_t m, const float* a, int64_t lda, const PackedMatrix& b, float* c, int64_t ldc,
               bool accumulate, int64_t first_panel = 0, int64_t end_panel = -1);

// Rows quantized to int8 per block of `block` values (the weights' quantization blocks): row r's values are
// q[r * ldq + i] * scales[r * lds + i / block], and sums[r * lds + b] is the sum of its block b's q values. ldq is
// a multiple of 4 and the values past K are 0.
struct Int8Rows {
  const int8_t* q;
  int64_t ldq;
  const float* scales;
  const int32_t* sums;
  int64_t lds;

  Int8Rows Row(int64_t r) const { return {q + r * ldq, ldq, scales + r * lds, sums + r * lds, lds}; }
};

// The storage of Int8Rows for `rows` rows of `k` values.
struct Int8RowsBuffer {
  std::vector<int8_t> q;
  std::vector<float> scales;
  std::vector<int32_t> sums;
  int64_t ldq = 0, lds = 0;

  void Resize(int64_t rows, int64_t k, int64_t block) {
    ldq = (k + 3) / 4 * 4;
    lds = (k + block - 1) / block;
    if (q.size() < static_cast<size_t>(rows * ldq)) q.resize(static_cast<size_t>(rows * ldq));
    if (scales.size() < static_cast<size_t>(rows * lds)) {
      scales.resize(static_cast<size_t>(rows * lds));
      sums.resize(static_cast<size_t>(rows * lds));
    }
  }
  Int8Rows View() const { return {q.data(), ldq, scales.data(), sums.data(), lds}; }
};

// c (+)= a @ b as PanelGemm, for int8 rows against a kInt8Quads matrix with the same blocks, as ONNX Runtime's MLAS
// (CompInt8) does: per block, the exact integer dot product of the rows' q with (code - zero point), then in float
// sum += float(dot) * (row scale * weight scale), blocks in order (a fused multiply-add; every kernel rounds
// alike, so all give the same bits).
void PanelGemmInt8(PanelIsa isa, int64_t m, const Int8Rows& a, const PackedMatrix& b, float* c, int64_t ldc,
                   bool accumulate, int64_t first_panel = 0, int64_t end_panel = -1);

template <typename Value>
void PackedMatrix::PackFloat(PanelFormat format, int64_t k, int64_t n, Value value) {
  Allocate(format, k, n, 0);
  for (int64_t p = 0; p < panel_count(); ++p) {
    const int64_t first = p * kPanelWidth, width = std::min(kPanelWidth, n - first);
    uint8_t* out = data_.data() + p * k * RowBytes(format);
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = 0; j < width; ++j) {
        if (format == PanelFormat::kFloat32) {
          reinterpret_cast<float*>(out)[i * kPanelWidth + j] = static_cast<float>(value(i, first + j));
        } else {
          reinterpret_cast<uint16_t*>(out)[i * kPanelWidth + j] = static_cast<uint16_t>(value(i, first + j));
        }
      }
    }
  }
}

template <typename Code, typename Scale, typename Zero>
void PackedMatrix::PackQuantized(int bits, int64_t block, int64_t k, int64_t n, Code code, Scale scale, Zero zero,
                                 bool int8_rows, bool uniform_zero) {
  const PanelFormat format = int8_rows ? PanelFormat::kInt8Quads : bits == 8 ? PanelFormat::kUint8 : PanelFormat::kUint4;
  Allocate(format, k, n, block, uniform_zero);
  if (uniform_zero) std::fill(zeros_.begin(), zeros_.end(), static_cast<uint8_t>(zero(0, 0)));
  const int64_t row_bytes = RowBytes(format), blocks = Blocks();
  for (int64_t p = 0; p < panel_count(); ++p) {
    const int64_t first = p * kPanelWidth, width = std::min(kPanelWidth, n - first);
    uint8_t* out = data_.data() + p * PanelRows() * row_bytes;
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = 0; j < width; ++j) {
        const auto value = static_cast<uint8_t>(code(i, first + j));
        if (int8_rows) {
          out[(i / 4) * 4 * kPanelWidth + j * 4 + i % 4] = value;
        } else if (bits == 8) {
          out[i * row_bytes + j] = value;
        } else {
          out[i * row_bytes + (j % 16)] |= static_cast<uint8_t>(j < 16 ? value : value << 4);
        }
      }
    }
  }
  PackBlockParameters(scale, zero, uniform_zero);
}

template <typename Scale, typename Zero>
void PackedMatrix::PackQuantizedRows(int bits, int64_t block, int64_t k, int64_t n, const uint8_t* codes,
                                     int64_t row_bytes, Scale scale, Zero zero, bool int8_rows, bool uniform_zero,
                                     const float* kept_scales, int64_t scale_stride, DropPages drop) {
  const PanelFormat format = int8_rows ? PanelFormat::kInt8Quads : bits == 8 ? PanelFormat::kUint8 : PanelFormat::kUint4;
  Allocate(format, k, n, block, uniform_zero, kept_scales != nullptr);
  kept_scales_ = kept_scales;
  scale_stride_ = scale_stride;
  drop_ = drop;
  if (kept_scales != nullptr) lazy_ = std::make_unique<Lazy>();
  if (uniform_zero) std::fill(zeros_.begin(), zeros_.end(), static_cast<uint8_t>(zero(0, 0)));
  PackCodeRows(bits, codes, row_bytes);
  PackBlockParameters(scale, zero, uniform_zero);
}

// Each panel's scales (and zero points unless uniform) per block of rows: [panel][block][kPanelWidth].
template <typename Scale, typename Zero>
void PackedMatrix::PackBlockParameters(Scale scale, Zero zero, bool uniform_zero) {
  const int64_t blocks = Blocks();
  for (int64_t p = 0; p < panel_count(); ++p) {
    const int64_t first = p * kPanelWidth, width = std::min(kPanelWidth, n_ - first);
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t j = 0; j < width; ++j) {
        if (kept_scales_ == nullptr) scales_[static_cast<size_t>((p * blocks + b) * kPanelWidth + j)] = scale(b, first + j);
        if (!uniform_zero)
          zeros_[static_cast<size_t>((p * blocks + b) * kPanelWidth + j)] = static_cast<uint8_t>(zero(b, first + j));
      }
    }
  }
}

}  // namespace ndp
