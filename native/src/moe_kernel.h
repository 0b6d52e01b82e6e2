// The sharded MoE expert kernel: ndp_ep::ShardedMoEExperts computed on the CPU.
//
// Mirrors the op contract in graph_passes/sharded_op.py (its docstring is the specification):
//   y[t] = sum_k routing_weights[t, k] * sum_s Down_{e,s}( act( First_{e,s}(x[t]) ) ),  e = expert_ids[t, k]
// Weights of every precision of the contract are converted to float32 once, when the node is compiled, into
// the x @ W layout ([in, out]); the compute groups tokens by expert, computes only the routed tokens, runs each
// shard's gate/up columns and down rows with cblas_sgemm and reduces the shards' partial sums in shard order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ndp {

enum class Activation { kSiluGlu, kGeluGlu, kSwigluClamp, kRelu, kGelu, kGeluTanh, kSilu };

// Parses a name of graph_passes/plan.py ACTIVATIONS; false for an unknown name.
bool ParseActivation(const std::string& name, Activation* out);
bool IsGated(Activation activation);

enum class WeightDtype { kFloat32, kFloat16, kBFloat16, kInt8, kInt4 };
bool ParseWeightDtype(const std::string& name, WeightDtype* out);
int QuantBits(WeightDtype dtype);  // 8, 4, or 0 for float weights

// The attributes of one node, validated by Validate().
struct MoESpec {
  std::string layer;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t hidden = 0;
  int64_t ffn = 0;
  int64_t shards = 0;
  Activation activation = Activation::kSiluGlu;
  float alpha = 1.702f;
  float limit = 7.0f;
  float beta = 1.0f;
  bool has_first_bias = false;
  bool has_down_bias = false;
  WeightDtype weight_dtype = WeightDtype::kFloat32;
  int64_t quant_block_size = 0;
  bool has_zero_points = false;

  bool gated() const { return IsGated(activation); }
  bool quantized() const { return QuantBits(weight_dtype) != 0; }
  int64_t shard_width() const { return ffn / shards; }                      // I/S
  int64_t first_width() const { return (gated() ? 2 : 1) * shard_width(); }  // F/S
  // Number of weight inputs after hidden, expert_ids, routing_weights.
  size_t weight_input_count() const;
  // An empty string when the spec is valid, else what is wrong.
  std::string Validate() const;
};

// A tensor handed to the weight loader: element type (ONNX enum value), shape and raw data.
struct RawTensor {
  int32_t elem_type = 0;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t element_count() const;
};

// One expert's weights as float32 in x @ W layout, shard-major.
struct ExpertWeights {
  std::vector<float> first;       // [H][S*F/S]: per shard s, columns s*F/S.. (gate columns then up columns)
  std::vector<float> down;        // [S][I/S][H]
  std::vector<float> first_bias;  // [S][F/S] or empty
  std::vector<float> down_bias;   // [H] or empty
};

// Runs fn(i) for i in [0, n), possibly in parallel; every i writes disjoint memory.
using ParallelFor = std::function<void(size_t n, const std::function<void(size_t)>& fn)>;

class MoEKernel {
 public:
  // Builds the kernel from the node's weight inputs (in contract order); returns an error message or "".
  std::string Load(const MoESpec& spec, const std::vector<RawTensor>& weights);

  const MoESpec& spec() const { return spec_; }
  // Bytes of float32 weights the kernel holds (the cost of converting fp16/bf16/int8/int4 at compile time).
  size_t weight_bytes() const;

  // x: [tokens, H] float32; ids: [tokens, K]; w: [tokens, K] float32; out: [tokens, H] float32.
  // Returns an error message or "". Deterministic: the result does not depend on how parallel_for schedules.
  std::string Compute(const float* x, const int64_t* ids, const float* w, int64_t tokens, float* out,
                      const ParallelFor& parallel_for) const;

 private:
  void RunExpert(int64_t expert, int64_t rows, const float* x, float* y) const;
  void Activate(float* h, int64_t rows, int64_t stride) const;

  MoESpec spec_;
  std::vector<ExpertWeights> experts_;
};

// Element conversions shared with the EP glue.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace ndp
