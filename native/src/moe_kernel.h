// The sharded MoE expert kernel: ndp_ep::ShardedMoEExperts computed on the CPU.
//
// Mirrors the op contract in graph_passes/sharded_op.py (its docstring is the specification):
//   y[t] = sum_k routing_weights[t, k] * sum_s Down_{e,s}( act( First_{e,s}(x[t]) ) ),  e = expert_ids[t, k]
// Weights of every precision and layout of the contract are packed once (when the node is compiled, or on an
// expert's first routing: Packing), into column
// panels of the x @ W matrix ([in, out]; an out_in float shard is transposed then) in their stored precision
// (panel_gemm.h), and widened to float32 in registers exactly as a float32 copy would hold them, so neither the
// layout nor the precision changes a rounding; the compute groups tokens by expert, computes only the routed
// tokens, runs each shard's gate/up columns and down rows with PanelGemm and reduces the shards' partial sums in
// shard order.
// Quantized projections that ONNX Runtime's own QMoE kernel runs with int8 activations (QuantComputeFor) get
// their input rows quantized to int8 per weight block, as ONNX Runtime's MLAS does, and multiplied as integers
// (QuantCompute, PanelGemmInt8).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "activations_gen.h"
#include "float_convert.h"
#include "panel_gemm.h"

namespace ndp {

// enum class Activation, kActivations, ApplyActivation and the kDefaultActivation* constants are generated at build
// time from the catalog graph_passes/activations.py (native/codegen.py).
// Parses a name of the catalog; false for an unknown name.
bool ParseActivation(const std::string& name, Activation* out);
bool IsGated(Activation activation);

// Parses a float weight layout of the contract: "in_out" (x @ W, *out_in = false) or "out_in" (its transpose).
bool ParseLayout(const std::string& name, bool* out_in);

enum class WeightDtype { kFloat32, kFloat16, kBFloat16, kInt8, kInt4 };
bool ParseWeightDtype(const std::string& name, WeightDtype* out);
int QuantBits(WeightDtype dtype);  // 8, 4, or 0 for float weights

// How a quantized projection multiplies its input.
//   kFloat: float32 input against the dequantized weights (q - zero_point) * scale, in float32 (SGEMM).
//   kInt8Activations: what ONNX Runtime's MLAS QNBit GEMM does with compute type CompInt8. Each input row is
//     quantized per weight block of `block` inputs (MLAS QuantizeARow_CompInt8): scale = amax / 127 (amax =
//     largest |value| of the block), q = round-half-to-even(value * (127 / amax)) (0 when amax is 0); MLAS then
//     sums over blocks (input scale * weight scale) * integer dot(q, q_w - zero_point) in float32, and so does the
//     kernel (PanelGemmInt8: the same int8 values and integer dot products; the float sums' rounding may differ
//     from MLAS's, about 1e-7 relative).
enum class QuantCompute { kFloat, kInt8Activations };

// The attributes of one node, validated by Validate().
struct MoESpec {
  std::string layer;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t hidden = 0;
  int64_t ffn = 0;
  int64_t shards = 0;
  Activation activation = kActivations[0].value;  // the attribute is required: never used as is
  float alpha = kDefaultActivationAlpha;
  float limit = kDefaultActivationLimit;
  float beta = kDefaultActivationBeta;
  bool has_first_bias = false;
  bool has_down_bias = false;
  WeightDtype weight_dtype = WeightDtype::kFloat32;
  int64_t quant_block_size = 0;
  bool has_zero_points = false;
  bool first_out_in = false;  // first_layout "out_in": float first shards are [F/S, H] (else [H, F/S])
  bool down_out_in = false;   // down_layout "out_in": float down shards are [H, I/S] (else [I/S, H])

  bool gated() const { return IsGated(activation); }
  bool quantized() const { return QuantBits(weight_dtype) != 0; }
  int64_t shard_width() const { return ffn / shards; }                      // I/S
  int64_t first_width() const { return (gated() ? 2 : 1) * shard_width(); }  // F/S
  // Number of weight inputs after hidden, expert_ids, routing_weights.
  size_t weight_input_count() const;
  // An empty string when the spec is valid, else what is wrong.
  std::string Validate() const;
};

// The environment variable ONNX Runtime's CPU QMoE kernel reads (onnxruntime/contrib_ops/cpu/moe/
// moe_quantization_cpu.cc, kQMoEQNBitGemmEnv).
constexpr const char* kQMoEQNBitGemmEnv = "ORT_QMOE_CPU_QNBIT_GEMM";

// The arithmetic ONNX Runtime's CPU com.microsoft.QMoE kernel uses for the block this node came from, so the
// sharded node gives what stock ONNX Runtime gives on the original model (float weights: kFloat). Measured on
// onnxruntime 1.23.2, 1.27, 1.29, 1.30, 1.31.0, 1.31.1 and 1.32.0 (docs/genai.md):
//   onnxruntime < 1.31: dequantize then SGEMM, every bit width; the environment variable is not read.
//   onnxruntime >= 1.31: block-wise 4/8-bit experts go through the MLAS QNBit GEMM. `env` is the value of
//     ORT_QMOE_CPU_QNBIT_GEMM (null or empty: unset). Unset: 8-bit takes int8 activations (MLAS has no float
//     kernel for 8 bits), 4-bit float (the QMoE node's accuracy_level 0; the sharded op does not carry
//     accuracy_level, which GenAI's model builder does not set). "fp32": float for both. "int8": int8 for both.
//     "0": the QNBit path off, float for both. Any other value: an error message (ONNX Runtime refuses the
//     session too). Block sizes MLAS has no QNBit kernel for (other than 16, 32, 64, 128, 256) stay float.
//     (onnxruntime's main branch also keeps zero points with a single block per row off QNBit; the releases
//     1.31 and 1.32 quantize those activations too, and so does this function.)
// `ort_major`/`ort_minor`: the version of the ONNX Runtime the library was loaded into.
std::string QuantComputeFor(const MoESpec& spec, int ort_major, int ort_minor, const char* env, QuantCompute* out);

// A tensor handed to the weight loader: element type (ONNX enum value), shape and raw data.
struct RawTensor {
  int32_t elem_type = 0;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  bool lasting = false;  // data outlives the kernel (a file mapping the compiled node keeps): float32 scales there
                         // are read in place instead of copied
  size_t element_count() const;
};

// One expert's weights in x @ W layout, packed into column panels in their stored precision.
struct ExpertWeights {
  std::vector<PackedMatrix> first;  // per shard [H, F/S] (gate columns then up columns)
  std::vector<PackedMatrix> down;   // per shard [I/S, H]
  std::vector<float> first_bias;  // [S][F/S] or empty
  std::vector<float> down_bias;   // [H] or empty
};

// Called with each source tensor once the kernel has packed what it needs from it (it never reads it again).
using ReleaseWeight = std::function<void(const RawTensor&)>;

// Runs fn(i) for i in [0, n), possibly in parallel; every i writes disjoint memory.
using ParallelFor = std::function<void(size_t n, const std::function<void(size_t)>& fn)>;

// When experts are packed (Load's `packing`). kLazy: each expert on its first routing, when every weight tensor is
// `lasting` (else up front, as kEager): a session is created in what validating the shapes costs and holds the
// packed experts its runs routed to, as stock ONNX Runtime's MoE holds the mapped float32 pages it read.
enum class Packing { kLazy, kEager };
// The environment variable that asks for kEager ("eager"; "lazy" or unset: kLazy).
constexpr const char* kPackingEnv = "NDP_EP_PACK_EXPERTS";
// Parses its value (null: unset); an error message for anything else.
std::string ParsePacking(const char* value, Packing* out);
// Experts packed by every kernel of the process so far (a count for tests of the work a run does).
int64_t ExpertsPackedTotal();

class MoEKernel {
 public:
  // Builds the kernel from the node's weight inputs (in contract order); returns an error message or "".
  // `compute` says how quantized projections multiply (ignored for float weights); `isa` which matrix kernel runs.
  // Every shape is checked now; experts are packed now or on their first routing (`packing`, see Packing), one
  // at a time; `release` (when set; kept by the kernel) gets each expert's tensors after its packing, so a caller
  // holding them in a file mapping can drop their pages.
  std::string Load(const MoESpec& spec, const std::vector<RawTensor>& weights, QuantCompute compute,
                   PanelIsa isa, const ReleaseWeight& release = nullptr, Packing packing = Packing::kEager);

  const MoESpec& spec() const { return spec_; }

  // x: [tokens, H] float32; ids: [tokens, K]; w: [tokens, K] float32; out: [tokens, H] float32.
  // Returns an error message or "". Deterministic: the result does not depend on how parallel_for schedules.
  std::string Compute(const float* x, const int64_t* ids, const float* w, int64_t tokens, float* out,
                      const ParallelFor& parallel_for) const;

 private:
  std::string CheckShapes() const;     // the source tensors against the spec
  void PackExpert(int64_t e) const;    // experts_[e] from the source tensors, then their release
  void EnsurePacked(int64_t e) const;  // PackExpert(e) once (thread-safe); a no-op when packed up front
  // The pieces of one expert's computation (moe_kernel.cc); *_panel: a range of output panels, end -1 for all.
  // With kInt8Activations the products take int8 rows: `xq`, the rows of x, and `hq` (rows from `hq_row` on), the
  // activations of every shard side by side (I values per row: shard s's at s * I/S); otherwise both are null.
  void FirstShard(int64_t expert, int64_t shard, int64_t rows, const float* x, const Int8Rows* xq, float* h,
                  int64_t ldh, int64_t first_panel, int64_t end_panel) const;
  void ActivateShard(int64_t expert, int64_t shard, int64_t rows, float* h, int64_t ldh, Int8RowsBuffer* hq,
                     int64_t hq_row) const;
  void AddDownBias(int64_t expert, int64_t rows, float* y) const;
  void DownShards(int64_t expert, int64_t rows, const float* h, int64_t ldh, const Int8RowsBuffer* hq,
                  int64_t hq_row, float* y) const;
  void DownProduct(int64_t expert, int64_t shard, int64_t rows, const float* h, int64_t ldh,
                   const Int8RowsBuffer* hq, int64_t hq_row, float* y, bool accumulate, int64_t first_panel,
                   int64_t end_panel) const;
  void RunExpert(int64_t expert, int64_t rows, const float* x, const Int8Rows* xq, float* y) const;
  // kInt8Activations applies per projection, as in ONNX Runtime: only to a projection whose input width (H for the
  // first, I for the down one) is a whole number of blocks; one with a partial last block multiplies in float.
  bool first_int8() const { return int8_for(spec_.hidden); }
  bool down_int8() const { return int8_for(spec_.ffn); }
  bool int8_for(int64_t inputs) const {
    return compute_ == QuantCompute::kInt8Activations && inputs % spec_.quant_block_size == 0;
  }

  MoESpec spec_;
  QuantCompute compute_ = QuantCompute::kFloat;
  PanelIsa isa_ = PanelIsa::kPortable;
  mutable std::vector<ExpertWeights> experts_;  // filled by PackExpert, under packed_once_[e] when lazy
  std::vector<RawTensor> sources_;              // the weight inputs while experts remain to be packed
  ReleaseWeight release_;
  bool lazy_ = false;
  std::unique_ptr<std::once_flag[]> packed_once_;     // per expert, lazy_ only
  std::unique_ptr<std::atomic<bool>[]> packed_;       // per expert: packed (acquire/release), lazy_ only
};

}  // namespace ndp
