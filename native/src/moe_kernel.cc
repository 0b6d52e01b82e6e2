// The sharded MoE expert kernel (see moe_kernel.h and graph_passes/sharded_op.py).
#include "moe_kernel.h"

#include "weight_map.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <tuple>
#include <cmath>
#include <cstring>

namespace ndp {
namespace {

constexpr int32_t kFloat = 1;
constexpr int32_t kUint8 = 2;
constexpr int32_t kFloat16 = 10;
constexpr int32_t kBFloat16 = 16;

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Reads element i of a float tensor of any float precision the contract allows.
bool IsFloatType(int32_t t) { return t == kFloat || t == kFloat16 || t == kBFloat16; }
float ReadFloat(const RawTensor& t, size_t i) {
  switch (t.elem_type) {
    case kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(t.data)[i]);
    case kBFloat16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(t.data)[i]);
    default:
      return static_cast<const float*>(t.data)[i];
  }
}

// The q-th unsigned value of a packed row (low nibble first for 4 bits).
inline int Unpack(const uint8_t* row, int64_t q, int bits) {
  if (bits == 8) return row[q];
  const uint8_t byte = row[q >> 1];
  return (q & 1) ? (byte >> 4) : (byte & 0x0F);
}

// The int8 value MLAS gives v (v = activation * 127 / amax, so |v| <= 127 up to rounding): rounded to nearest,
// ties to even, as _mm512_roundscale_ps / _mm256_round_ps with _MM_ROUND_NEAREST do (std::rint in the default
// rounding mode, which ONNX Runtime keeps; v is rounded to float before, never fused into it), within [-127, 127].
inline float QuantizeValue(float v) { return std::min(std::max(std::rint(v), -127.0f), 127.0f); }

// Quantizes `rows` rows of `k` floats (``lda`` apart) to int8 as MLAS's QuantizeARow_CompInt8 does, per block of
// `block`: scale = amax / 127, q = round-half-even(v * (127 / amax)) in [-127, 127] (0 when amax is 0); writes q
// (``ldq`` apart), each block's scale and the sum of its q (``lds`` apart).
void QuantizeRowsInt8(const float* a, int64_t rows, int64_t lda, int64_t k, int64_t block, int8_t* q, int64_t ldq,
                      float* scales, int32_t* sums, int64_t lds) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t start = 0, b = 0; start < k; start += block, ++b) {
      const float* v = a + r * lda + start;
      int8_t* out = q + r * ldq + start;
      const int64_t count = std::min(block, k - start);
      float amax = 0.0f;
      for (int64_t i = 0; i < count; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
      int32_t sum = 0;
      for (int64_t i = 0; i < count; ++i) {
        out[i] = static_cast<int8_t>(QuantizeValue(v[i] * inverse));
        sum += out[i];
      }
      scales[r * lds + b] = amax / 127.0f;
      sums[r * lds + b] = sum;
    }
    for (int64_t i = k; i % 4; ++i) q[r * ldq + i] = 0;  // the last quad's padding
  }
}

}  // namespace

std::string QuantComputeFor(const MoESpec& spec, int ort_major, int ort_minor, const char* env, QuantCompute* out) {
  *out = QuantCompute::kFloat;
  const int bits = QuantBits(spec.weight_dtype);
  if (!bits || ort_major < 1 || (ort_major == 1 && ort_minor < 31)) return "";
  const std::string value = env ? env : "";
  bool int8 = bits == 8;  // unset: accuracy_level 0, where MLAS has a float kernel only for 4 bits
  if (value == "0" || value == "fp32") {
    int8 = false;
  } else if (value == "int8") {
    int8 = true;
  } else if (!value.empty()) {
    return std::string(kQMoEQNBitGemmEnv) + " must be 0, fp32 or int8 (as for ONNX Runtime's QMoE), got '" +
           value + "'";
  }
  const int64_t block = spec.quant_block_size;
  if (int8 && (block == 16 || block == 32 || block == 64 || block == 128 || block == 256))
    *out = QuantCompute::kInt8Activations;
  return "";
}

bool ParseActivation(const std::string& name, Activation* out) {
  for (const ActivationInfo& entry : kActivations) {
    if (name == entry.name) {
      *out = entry.value;
      return true;
    }
  }
  return false;
}

bool IsGated(Activation a) {
  for (const ActivationInfo& entry : kActivations)
    if (entry.value == a) return entry.gated;
  return false;
}

bool ParseWeightDtype(const std::string& name, WeightDtype* out) {
  static const std::pair<const char*, WeightDtype> kNames[] = {{"float32", WeightDtype::kFloat32},
                                                               {"float16", WeightDtype::kFloat16},
                                                               {"bfloat16", WeightDtype::kBFloat16},
                                                               {"int8", WeightDtype::kInt8},
                                                               {"int4", WeightDtype::kInt4}};
  for (const auto& [text, value] : kNames) {
    if (name == text) {
      *out = value;
      return true;
    }
  }
  return false;
}

bool ParseLayout(const std::string& name, bool* out_in) {
  if (name != "in_out" && name != "out_in") return false;
  *out_in = name == "out_in";
  return true;
}

int QuantBits(WeightDtype dtype) {
  return dtype == WeightDtype::kInt8 ? 8 : dtype == WeightDtype::kInt4 ? 4 : 0;
}

size_t MoESpec::weight_input_count() const {
  const size_t per_shard = static_cast<size_t>(num_experts * shards);
  size_t count = 2 * per_shard;
  if (quantized()) count += (has_zero_points ? 4 : 2) * per_shard;
  if (has_first_bias) count += per_shard;
  if (has_down_bias) count += static_cast<size_t>(num_experts);
  return count;
}

std::string MoESpec::Validate() const {
  if (num_experts < 1 || top_k < 1 || hidden < 1 || ffn < 1 || shards < 1)
    return layer + ": num_experts, top_k, hidden, ffn and shards must be positive";
  if (top_k > num_experts) return layer + ": top_k exceeds num_experts";
  if (ffn % shards) return layer + ": ffn is not divisible by shards";
  if (quantized()) {
    const int64_t block = quant_block_size;
    if (block < 1 || (shards > 1 && shard_width() % block))  // H, or one shard's I, may end in a partial block
      return layer + ": quant_block_size must be positive and divide the shard width of several shards";
    if (QuantBits(weight_dtype) == 4 && (hidden % 2 || shard_width() % 2))
      return layer + ": int4 weights pack two values per byte: hidden " + std::to_string(hidden) +
             " and the shard width " + std::to_string(shard_width()) + " must be even";
    if (first_out_in || down_out_in) return layer + ": first_layout/down_layout on quantized weights";
  } else if (quant_block_size || has_zero_points) {
    return layer + ": quantization attributes on float weights";
  }
  return "";
}

size_t RawTensor::element_count() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

namespace {
// The weight inputs of a node by group (contract order), each group's tensor of expert e, shard s at [e * S + s]
// (down_bias: [e]); null for a group the node has not.
struct SourceGroups {
  const RawTensor *first = nullptr, *down = nullptr, *first_scales = nullptr, *down_scales = nullptr;
  const RawTensor *first_zp = nullptr, *down_zp = nullptr, *first_bias = nullptr, *down_bias = nullptr;
};
SourceGroups GroupSources(const MoESpec& spec, const std::vector<RawTensor>& weights) {
  SourceGroups g;
  const size_t per_shard = static_cast<size_t>(spec.num_experts * spec.shards);
  size_t position = 0;
  auto next = [&]() { return &weights[(position += per_shard) - per_shard]; };
  g.first = next();
  g.down = next();
  if (spec.quantized()) {
    g.first_scales = next();
    g.down_scales = next();
    if (spec.has_zero_points) {
      g.first_zp = next();
      g.down_zp = next();
    }
  }
  if (spec.has_first_bias) g.first_bias = next();
  if (spec.has_down_bias) g.down_bias = &weights[position];
  return g;
}

std::atomic<int64_t> g_experts_packed{0};
}  // namespace

std::string ParsePacking(const char* value, Packing* out) {
  const std::string text = value ? value : "";
  if (text.empty() || text == "lazy") {
    *out = Packing::kLazy;
  } else if (text == "eager") {
    *out = Packing::kEager;
  } else {
    return std::string(kPackingEnv) + " must be lazy or eager, got '" + text + "'";
  }
  return "";
}

int64_t ExpertsPackedTotal() { return g_experts_packed.load(std::memory_order_relaxed); }

std::string MoEKernel::Load(const MoESpec& spec, const std::vector<RawTensor>& weights, QuantCompute compute,
                            PanelIsa isa, const ReleaseWeight& release, Packing packing) {
  std::string error = spec.Validate();
  if (!error.empty()) return error;
  if (weights.size() != spec.weight_input_count())
    return spec.layer + ": expected " + std::to_string(spec.weight_input_count()) + " weight inputs, found " +
           std::to_string(weights.size());
  spec_ = spec;
  compute_ = spec.quantized() ? compute : QuantCompute::kFloat;
  isa_ = isa;
  sources_ = weights;
  release_ = release;
  error = CheckShapes();
  if (!error.empty()) return error;
  const int64_t E = spec.num_experts;
  experts_.clear();
  experts_.resize(static_cast<size_t>(E));  // PackedMatrix is move-only (its lazily copied scales)
  lazy_ = packing == Packing::kLazy &&
          std::all_of(weights.begin(), weights.end(), [](const RawTensor& t) { return t.lasting; });
  if (lazy_) {
    packed_once_ = std::make_unique<std::once_flag[]>(static_cast<size_t>(E));
    packed_ = std::make_unique<std::atomic<bool>[]>(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) packed_[e].store(false);
    return "";
  }
  for (int64_t e = 0; e < E; ++e) PackExpert(e);
  sources_.clear();  // never read again
  release_ = nullptr;
  return "";
}

std::string MoEKernel::CheckShapes() const {
  const MoESpec& spec = spec_;
  const SourceGroups g = GroupSources(spec, sources_);
  const int64_t E = spec.num_experts, S = spec.shards, H = spec.hidden, Is = spec.shard_width();
  const int64_t Fs = spec.first_width(), block = spec.quant_block_size;
  const int bits = QuantBits(spec.weight_dtype);
  auto check = [&](const RawTensor& t, const char* what, std::vector<int64_t> shape, bool quantized_data) {
    if (t.shape != shape)
      return spec.layer + ": " + what + " has shape " + ShapeText(t.shape) + ", expected " + ShapeText(shape);
    if (quantized_data ? t.elem_type != kUint8 : !IsFloatType(t.elem_type))
      return spec.layer + ": " + what + (quantized_data ? " must be uint8" : " must be a float tensor");
    return std::string();
  };
  std::string error;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t s = 0; s < S; ++s) {
      const size_t i = static_cast<size_t>(e * S + s);
      if (bits) {
        const int64_t blocks_first = (H + block - 1) / block, blocks_down = (Is + block - 1) / block;
        for (auto [t, what, shape, quant] :
             {std::make_tuple(g.first + i, "first", std::vector<int64_t>{Fs, H * bits / 8}, true),
              std::make_tuple(g.down + i, "down", std::vector<int64_t>{H, Is * bits / 8}, true),
              std::make_tuple(g.first_scales + i, "first_scales", std::vector<int64_t>{Fs, blocks_first}, false),
              std::make_tuple(g.down_scales + i, "down_scales", std::vector<int64_t>{H, blocks_down}, false)}) {
          error = check(*t, what, shape, quant);
          if (!error.empty()) return error;
        }
        if (g.first_zp) {
          error = check(g.first_zp[i], "first_zero_points", {Fs, (blocks_first * bits + 7) / 8}, true);
          if (error.empty()) error = check(g.down_zp[i], "down_zero_points", {H, (blocks_down * bits + 7) / 8}, true);
        }
      } else {
        const bool first_t = spec.first_out_in, down_t = spec.down_out_in;
        error = check(g.first[i], "first", first_t ? std::vector<int64_t>{Fs, H} : std::vector<int64_t>{H, Fs}, false);
        if (error.empty())
          error = check(g.down[i], "down", down_t ? std::vector<int64_t>{H, Is} : std::vector<int64_t>{Is, H}, false);
      }
      if (error.empty() && g.first_bias) error = check(g.first_bias[i], "first_bias", {Fs}, false);
      if (!error.empty()) return error;
    }
    if (g.down_bias) {
      error = check(g.down_bias[e], "down_bias", {H}, false);
      if (!error.empty()) return error;
    }
  }
  return "";
}

void MoEKernel::EnsurePacked(int64_t e) const {
  if (!lazy_ || packed_[e].load(std::memory_order_acquire)) return;
  std::call_once(packed_once_[static_cast<size_t>(e)], [this, e] {
    PackExpert(e);
    packed_[e].store(true, std::memory_order_release);
  });
}

void MoEKernel::PackExpert(int64_t e) const {
  const MoESpec& spec = spec_;
  const SourceGroups g = GroupSources(spec, sources_);
  const int64_t S = spec.shards, H = spec.hidden, Is = spec.shard_width(), Fs = spec.first_width();
  const int bits = QuantBits(spec.weight_dtype);
  // The K x N (x @ W) matrices are packed straight from the tensors, in their stored precision. Element (i, j) of
  // a float shard sits at i * N + j (in_out) or j * K + i (out_in); a quantized shard is [N, K * bits / 8] (row =
  // output feature j, packed along the input i) with scales and zero points [N, ceil(K / block)].
  const int64_t block = spec.quant_block_size;
  const int default_zero = bits ? 1 << (bits - 1) : 0;
  auto pack_float = [&](PackedMatrix& out, const RawTensor& t, int64_t k, int64_t n, bool out_in) {
    auto index = [&](int64_t i, int64_t j) { return static_cast<size_t>(out_in ? j * k + i : i * n + j); };
    if (t.elem_type == kFloat16 || t.elem_type == kBFloat16) {
      const auto* raw = static_cast<const uint16_t*>(t.data);
      out.PackFloat(t.elem_type == kFloat16 ? PanelFormat::kFloat16 : PanelFormat::kBFloat16, k, n,
                    [&](int64_t i, int64_t j) { return raw[index(i, j)]; });
    } else {
      out.PackFloat(PanelFormat::kFloat32, k, n, [&](int64_t i, int64_t j) { return ReadFloat(t, index(i, j)); });
    }
  };
  auto pack_quantized = [&](PackedMatrix& out, const RawTensor& codes, const RawTensor& scales,
                            const RawTensor* zeros, int64_t k, int64_t n, bool int8) {
    const int64_t row_bytes = k * bits / 8, blocks = (k + block - 1) / block, zero_row_bytes = (blocks * bits + 7) / 8;
    const auto* code_data = static_cast<const uint8_t*>(codes.data);
    const auto* zero_data = zeros ? static_cast<const uint8_t*>(zeros->data) : nullptr;
    // Packed up front, float32 scales in a mapping that lasts are copied on the matrix's first product (then
    // their file pages are dropped): a session holds the scales of the experts runs routed to, as stock ONNX
    // Runtime's QMoE does. An expert packed on its first routing copies them now.
    const bool keep = !lazy_ && scales.lasting && scales.elem_type == kFloat;
    out.PackQuantizedRows(
        bits, block, k, n, code_data, row_bytes,
        [&](int64_t b, int64_t j) { return ReadFloat(scales, static_cast<size_t>(j * blocks + b)); },
        [&](int64_t b, int64_t j) { return zero_data ? Unpack(zero_data + j * zero_row_bytes, b, bits) : default_zero; },
        int8,              // int8 rows multiply the codes one byte each, four rows at a time
        zeros == nullptr,  // no zero points: the default one, kept once
        keep ? static_cast<const float*>(scales.data) : nullptr, blocks, DropFilePages);
  };

  ExpertWeights& w = experts_[static_cast<size_t>(e)];
  w.first.resize(static_cast<size_t>(S));
  w.down.resize(static_cast<size_t>(S));
  if (g.first_bias) w.first_bias.resize(static_cast<size_t>(S * Fs));
  for (int64_t s = 0; s < S; ++s) {
    const size_t i = static_cast<size_t>(e * S + s);
    PackedMatrix &first_out = w.first[static_cast<size_t>(s)], &down_out = w.down[static_cast<size_t>(s)];
    if (bits) {
      pack_quantized(first_out, g.first[i], g.first_scales[i], g.first_zp ? &g.first_zp[i] : nullptr, H, Fs,
                     first_int8());
      pack_quantized(down_out, g.down[i], g.down_scales[i], g.down_zp ? &g.down_zp[i] : nullptr, Is, H, down_int8());
    } else {
      pack_float(first_out, g.first[i], H, Fs, spec.first_out_in);
      pack_float(down_out, g.down[i], Is, H, spec.down_out_in);
    }
    if (g.first_bias)
      for (int64_t j = 0; j < Fs; ++j) w.first_bias[static_cast<size_t>(s * Fs + j)] = ReadFloat(g.first_bias[i], j);
  }
  if (g.down_bias) {
    w.down_bias.resize(static_cast<size_t>(H));
    for (int64_t j = 0; j < H; ++j) w.down_bias[static_cast<size_t>(j)] = ReadFloat(g.down_bias[e], j);
  }
  g_experts_packed.fetch_add(1, std::memory_order_relaxed);
  if (release_) {  // expert e is packed: its source tensors are not read again
    for (int64_t s = 0; s < S; ++s) {
      const size_t i = static_cast<size_t>(e * S + s);
      for (const RawTensor* group :
           {g.first, g.down, g.first_scales, g.down_scales, g.first_zp, g.down_zp, g.first_bias})
        if (group) release_(group[i]);
    }
    if (g.down_bias) release_(g.down_bias[e]);
  }
}

namespace {
struct CallScratch {
  std::vector<int64_t> counts, offsets, fill, slot_row, active, unpacked;
  std::vector<float> xg, hg, yg, partial;  // partial: split calls' per-shard down products [S][slots][H]
  Int8RowsBuffer xq, hq;                    // kInt8Activations: xg's int8 rows; split calls' activations [slots, I]
  std::vector<std::array<int64_t, 3>> first_tasks, down_tasks;  // split calls: (expert, shard, first panel)
};
thread_local CallScratch t_call;
thread_local std::vector<float> t_hidden;  // per-thread scratch of RunExpert: [rows, S * F/S]
thread_local Int8RowsBuffer t_hidden_q;    // and, for kInt8Activations, its activations' int8 rows [rows, I]

// A call with at most this many token slots (a decode step: top-k slots per token) splits each expert's products
// into column ranges of kPanelsPerTask panels, so that every thread of ONNX Runtime's pool gets work even when
// a single expert is routed (top-1); larger calls give each thread whole experts, whose activations stay in cache.
constexpr size_t kSplitSlots = 16;
constexpr int64_t kPanelsPerTask = 4;
}  // namespace

void MoEKernel::FirstShard(int64_t expert, int64_t shard, int64_t rows, const float* x, const Int8Rows* xq,
                           float* h, int64_t ldh, int64_t first_panel, int64_t end_panel) const {
  const PackedMatrix& first = experts_[static_cast<size_t>(expert)].first[static_cast<size_t>(shard)];
  if (xq) {
    PanelGemmInt8(isa_, rows, *xq, first, h, ldh, false, first_panel, end_panel);
  } else {
    PanelGemm(isa_, rows, x, spec_.hidden, first, h, ldh, false, first_panel, end_panel);
  }
}

// In place on shard s's columns of h (rows ``ldh`` apart): the first bias, then the activation (row r's goes to its
// first I/S values); then, for kInt8Activations, those values quantized to int8 per block of I/S into `hq` (rows
// from `hq_row`, shard s's place), ONNX Runtime's blocks of I since shards are cut on block boundaries.
void MoEKernel::ActivateShard(int64_t expert, int64_t shard, int64_t rows, float* h, int64_t ldh,
                              Int8RowsBuffer* hq, int64_t hq_row) const {
  const ExpertWeights& w = experts_[static_cast<size_t>(expert)];
  const int64_t Is = spec_.shard_width(), Fs = spec_.first_width();
  if (!w.first_bias.empty()) {
    const float* bias = w.first_bias.data() + shard * Fs;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < Fs; ++j) h[r * ldh + j] += bias[j];
  }
  for (int64_t r = 0; r < rows; ++r)
    ApplyActivation(spec_.activation, h + r * ldh, Is, spec_.alpha, spec_.limit, spec_.beta);
  if (hq) {
    const int64_t block = spec_.quant_block_size, blocks = Is / block;
    QuantizeRowsInt8(h, rows, ldh, Is, block, hq->q.data() + hq_row * hq->ldq + shard * Is, hq->ldq,
                     hq->scales.data() + hq_row * hq->lds + shard * blocks,
                     hq->sums.data() + hq_row * hq->lds + shard * blocks, hq->lds);
  }
}

// y[rows, H] += the expert's down bias (nothing without one).
void MoEKernel::AddDownBias(int64_t expert, int64_t rows, float* y) const {
  const std::vector<float>& bias = experts_[static_cast<size_t>(expert)].down_bias;
  if (bias.empty()) return;
  const int64_t H = spec_.hidden;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < H; ++j) y[r * H + j] += bias[static_cast<size_t>(j)];
}

// y (+)= shard s's activations @ Down_s, output panels [first_panel, end_panel): the float activations in h (shard
// s's at s * F/S), or their int8 rows in hq.
void MoEKernel::DownProduct(int64_t expert, int64_t shard, int64_t rows, const float* h, int64_t ldh,
                            const Int8RowsBuffer* hq, int64_t hq_row, float* y, bool accumulate, int64_t first_panel,
                            int64_t end_panel) const {
  const PackedMatrix& down = experts_[static_cast<size_t>(expert)].down[static_cast<size_t>(shard)];
  const int64_t H = spec_.hidden;
  if (hq) {
    const int64_t Is = spec_.shard_width(), blocks = Is / spec_.quant_block_size;
    const Int8Rows shard_rows{hq->q.data() + hq_row * hq->ldq + shard * Is, hq->ldq,
                              hq->scales.data() + hq_row * hq->lds + shard * blocks,
                              hq->sums.data() + hq_row * hq->lds + shard * blocks, hq->lds};
    PanelGemmInt8(isa_, rows, shard_rows, down, y, H, accumulate, first_panel, end_panel);
  } else {
    PanelGemm(isa_, rows, h + shard * spec_.first_width(), ldh, down, y, H, accumulate, first_panel, end_panel);
  }
}

// y = sum over shards s in shard order of h_s @ Down_s, plus the down bias.
void MoEKernel::DownShards(int64_t expert, int64_t rows, const float* h, int64_t ldh, const Int8RowsBuffer* hq,
                           int64_t hq_row, float* y) const {
  for (int64_t s = 0; s < spec_.shards; ++s) DownProduct(expert, s, rows, h, ldh, hq, hq_row, y, s > 0, 0, -1);
  AddDownBias(expert, rows, y);
}

// y[rows, H] = sum over shards s (in order) of act(x @ First_s + b_s) @ Down_s, plus the down bias, on one thread:
// every shard's first projection and activation, then the down projections, while the activations are in cache.
void MoEKernel::RunExpert(int64_t expert, int64_t rows, const float* x, const Int8Rows* xq, float* y) const {
  const int64_t width = spec_.shards * spec_.first_width();
  std::vector<float>& hidden = t_hidden;
  if (hidden.size() < static_cast<size_t>(rows * width)) hidden.resize(static_cast<size_t>(rows * width));
  Int8RowsBuffer* hq = nullptr;
  if (down_int8()) {
    hq = &t_hidden_q;
    hq->Resize(rows, spec_.ffn, spec_.quant_block_size);
  }
  for (int64_t s = 0; s < spec_.shards; ++s) {
    float* h = hidden.data() + s * spec_.first_width();  // shard s's columns, ``width`` apart
    FirstShard(expert, s, rows, x, xq, h, width, 0, -1);
    ActivateShard(expert, s, rows, h, width, hq, 0);
  }
  DownShards(expert, rows, hidden.data(), width, hq, 0, y);
}

std::string MoEKernel::Compute(const float* x, const int64_t* ids, const float* w, int64_t tokens, float* out,
                               const ParallelFor& parallel_for) const {
  const int64_t E = spec_.num_experts, K = spec_.top_k, H = spec_.hidden, S = spec_.shards;
  const int64_t Fs = spec_.first_width(), width = S * Fs;
  if (tokens == 0) return "";
  CallScratch& c = t_call;
  const size_t slots = static_cast<size_t>(tokens * K);
  c.counts.assign(static_cast<size_t>(E), 0);
  for (size_t i = 0; i < slots; ++i) {
    const int64_t e = ids[i];
    if (e < 0 || e >= E)
      return spec_.layer + ": expert id " + std::to_string(e) + " out of range 0.." + std::to_string(E - 1);
    ++c.counts[static_cast<size_t>(e)];
  }
  // Rows grouped by expert, in token order within an expert.
  c.offsets.assign(static_cast<size_t>(E + 1), 0);
  c.active.clear();
  for (int64_t e = 0; e < E; ++e) {
    c.offsets[static_cast<size_t>(e + 1)] = c.offsets[static_cast<size_t>(e)] + c.counts[static_cast<size_t>(e)];
    if (c.counts[static_cast<size_t>(e)]) c.active.push_back(e);
  }
  if (lazy_) {  // the routed experts not packed yet, each on a thread of its own
    c.unpacked.clear();
    for (int64_t e : c.active)
      if (!packed_[e].load(std::memory_order_acquire)) c.unpacked.push_back(e);
    if (!c.unpacked.empty()) {
      CallScratch* pending = &c;
      parallel_for(c.unpacked.size(), [this, pending](size_t task) { EnsurePacked(pending->unpacked[task]); });
      for (int64_t e : c.unpacked)  // a task that failed left its expert unpacked (the call reports the error)
        if (!packed_[e].load(std::memory_order_acquire))
          return spec_.layer + ": expert " + std::to_string(e) + " could not be packed";
    }
  }
  c.fill.assign(c.offsets.begin(), c.offsets.end() - 1);
  c.slot_row.resize(slots);
  if (c.xg.size() < slots * H) c.xg.resize(slots * H);
  if (c.yg.size() < slots * H) c.yg.resize(slots * H);
  for (size_t i = 0; i < slots; ++i) {
    const int64_t row = c.fill[static_cast<size_t>(ids[i])]++;
    c.slot_row[i] = row;
    std::memcpy(c.xg.data() + row * H, x + (static_cast<int64_t>(i) / K) * H, sizeof(float) * H);
  }
  const bool int8 = first_int8();  // int8 rows of x; down_int8() says whether the activations get them too
  if (int8) {  // x per block of H, as ONNX Runtime's QMoE does
    c.xq.Resize(static_cast<int64_t>(slots), H, spec_.quant_block_size);
    QuantizeRowsInt8(c.xg.data(), static_cast<int64_t>(slots), H, H, spec_.quant_block_size, c.xq.q.data(), c.xq.ldq,
                     c.xq.scales.data(), c.xq.sums.data(), c.xq.lds);
  }
  CallScratch* cs = &c;
  if (slots > kSplitSlots) {
    parallel_for(c.active.size(), [this, cs, H, int8](size_t task) {
      const int64_t e = cs->active[task];
      const int64_t start = cs->offsets[static_cast<size_t>(e)];
      const Int8Rows xq = int8 ? cs->xq.View().Row(start) : Int8Rows{};
      RunExpert(e, cs->counts[static_cast<size_t>(e)], cs->xg.data() + start * H, int8 ? &xq : nullptr,
                cs->yg.data() + start * H);
    });
  } else {  // the same products and reductions, cut into column ranges
    if (c.hg.size() < slots * width) c.hg.resize(slots * width);
    c.first_tasks.clear();
    c.down_tasks.clear();
    for (int64_t e : c.active) {
      const ExpertWeights& weights = experts_[static_cast<size_t>(e)];
      for (int64_t s = 0; s < S; ++s) {
        for (int64_t p = 0; p < weights.first[static_cast<size_t>(s)].panel_count(); p += kPanelsPerTask)
          c.first_tasks.push_back({e, s, p});
        for (int64_t p = 0; p < weights.down[static_cast<size_t>(s)].panel_count(); p += kPanelsPerTask)
          c.down_tasks.push_back({e, s, p});
      }
    }
    Int8RowsBuffer* hq = nullptr;
    if (down_int8()) {
      hq = &c.hq;
      hq->Resize(static_cast<int64_t>(slots), spec_.ffn, spec_.quant_block_size);
    }
    parallel_for(c.first_tasks.size(), [this, cs, H, Fs, width, int8](size_t task) {
      const auto [e, s, p] = cs->first_tasks[task];
      const int64_t start = cs->offsets[static_cast<size_t>(e)], rows = cs->counts[static_cast<size_t>(e)];
      const Int8Rows xq = int8 ? cs->xq.View().Row(start) : Int8Rows{};
      FirstShard(e, s, rows, cs->xg.data() + start * H, int8 ? &xq : nullptr, cs->hg.data() + start * width + s * Fs,
                 width, p, p + kPanelsPerTask);
    });
    for (int64_t e : c.active)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t start = c.offsets[static_cast<size_t>(e)];
        ActivateShard(e, s, c.counts[static_cast<size_t>(e)], c.hg.data() + start * width + s * Fs, width, hq,
                      start);
      }
    // each shard's down product on its own (each weight matrix streamed in order), then the shards' sums added in
    // shard order: the same roundings as accumulating them one after the other
    if (c.partial.size() < static_cast<size_t>(S) * slots * H) c.partial.resize(static_cast<size_t>(S) * slots * H);
    parallel_for(c.down_tasks.size(), [this, cs, H, width, slots, hq](size_t task) {
      const auto [e, s, p] = cs->down_tasks[task];
      const int64_t start = cs->offsets[static_cast<size_t>(e)], rows = cs->counts[static_cast<size_t>(e)];
      DownProduct(e, s, rows, cs->hg.data() + start * width, width, hq, start,
                  cs->partial.data() + (static_cast<size_t>(s) * slots + static_cast<size_t>(start)) * H, false, p,
                  p + kPanelsPerTask);
    });
    for (size_t r = 0; r < slots; ++r) {  // every row: the active experts' rows are all the slots
      float* y = c.yg.data() + r * H;
      std::memcpy(y, c.partial.data() + r * H, sizeof(float) * H);
      for (int64_t s = 1; s < S; ++s) {
        const float* part = c.partial.data() + (static_cast<size_t>(s) * slots + r) * H;
        for (int64_t j = 0; j < H; ++j) y[j] += part[j];
      }
    }
    for (int64_t e : c.active)
      AddDownBias(e, c.counts[static_cast<size_t>(e)], c.yg.data() + c.offsets[static_cast<size_t>(e)] * H);
  }
  // Weighted sum over each token's K slots in slot order.
  constexpr int64_t kTokensPerTask = 16;
  const size_t tasks = static_cast<size_t>((tokens + kTokensPerTask - 1) / kTokensPerTask);
  auto combine = [cs, w, out, tokens, K, H](size_t task) {
    const int64_t stop = std::min<int64_t>(tokens, static_cast<int64_t>(task + 1) * kTokensPerTask);
    for (int64_t t = static_cast<int64_t>(task) * kTokensPerTask; t < stop; ++t) {
      float* o = out + t * H;
      for (int64_t k = 0; k < K; ++k) {
        const float weight = w[t * K + k];
        const float* y = cs->yg.data() + cs->slot_row[static_cast<size_t>(t * K + k)] * H;
        if (k == 0) {
          for (int64_t j = 0; j < H; ++j) o[j] = weight * y[j];
        } else {
          for (int64_t j = 0; j < H; ++j) o[j] += weight * y[j];
        }
      }
    }
  };
  if (tasks == 1) {
    combine(0);
  } else {
    parallel_for(tasks, combine);
  }
  return "";
}

}  // namespace ndp
