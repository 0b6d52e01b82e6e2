// ndp-ep as an ONNX Runtime plugin execution provider: the OrtEpFactory / OrtEp of "NdpExecutionProvider".
//
// GetCapability claims exactly the ndp_ep::ShardedMoEExperts nodes (one fused node each, contract in
// graph_passes/sharded_op.py); Compile converts their weights into MoEKernel objects, quantized ones set to
// multiply as the loading ONNX Runtime's QMoE kernel would (its version, ORT_QMOE_CPU_QNBIT_GEMM: QuantComputeFor
// in moe_kernel.h); the compute function
// runs them on ONNX Runtime's intra-op thread pool and records each invocation's routing in the session's
// RoutingLog. The library targets ORT API 23 (so one build loads into onnxruntime 1.23 and every later
// release); on runtimes with API >= 24 the factory also supplies the op's schema (a placeholder custom op), so
// a session with the EP added needs nothing else. Older runtimes get the same schema through the exported
// RegisterCustomOps (SessionOptions.register_custom_ops_library), which ndp_ep.session_options() calls.
#include <onnxruntime_c_api.h>


#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "float_convert.h"
#include "moe_kernel.h"
#include "op_contract_gen.h"  // kDomain, kOpType, kOpsetVersion: generated from graph_passes/sharded_op.py
#include "boundary.h"
#include "routing_log.h"
#include "weight_map.h"

#ifndef NDP_EP_VERSION
#define NDP_EP_VERSION "0.0.0"
#endif

namespace ndp {
namespace {

constexpr uint32_t kApiVersion = 23;        // the oldest ORT API this library needs
constexpr uint32_t kSchemaApiVersion = 24;  // OrtEpFactory::GetCustomOpDomains appeared in 1.24
constexpr const char* kEpName = "NdpExecutionProvider";
constexpr const char* kVendor = "ndp-ep";
constexpr const char* kOptionPrefix = "ep.ndpexecutionprovider.";
constexpr const char* kRunTagKey = "ep.ndpexecutionprovider.run_tag";  // run config entry
constexpr size_t kDefaultRoutingCapacity = 16384;  // records (layer invocations) kept per session

const OrtApi* g_api = nullptr;
const OrtEpApi* g_ep_api = nullptr;
uint32_t g_runtime_api = 0;
int g_ort_major = 0, g_ort_minor = 0;  // the loading ONNX Runtime's version (OrtApiBase::GetVersionString)

OrtStatus* Error(OrtErrorCode code, const std::string& message) {
  return g_api->CreateStatus(code, ("ndp-ep: " + message).c_str());
}

#define NDP_RETURN_IF_ERROR(expr)    \
  do {                               \
    OrtStatus* _status = (expr);     \
    if (_status != nullptr) return _status; \
  } while (0)

// ---- attributes ---------------------------------------------------------------------------------------------
// Returns false (attribute absent) or true with the value; ORT 1.23 reports a missing attribute as an error.
bool FindAttribute(const OrtNode* node, const char* name, const OrtOpAttr** attr) {
  *attr = nullptr;
  OrtStatus* status = g_api->Node_GetAttributeByName(node, name, attr);
  if (status != nullptr) {
    g_api->ReleaseStatus(status);
    return false;
  }
  return *attr != nullptr;
}

OrtStatus* ReadInt(const OrtNode* node, const char* name, int64_t* out, bool required) {
  const OrtOpAttr* attr;
  if (!FindAttribute(node, name, &attr))
    return required ? Error(ORT_INVALID_GRAPH, std::string("missing attribute ") + name) : nullptr;
  size_t size = 0;
  return g_api->ReadOpAttr(attr, ORT_OP_ATTR_INT, out, sizeof(int64_t), &size);
}

OrtStatus* ReadFloat(const OrtNode* node, const char* name, float* out) {
  const OrtOpAttr* attr;
  if (!FindAttribute(node, name, &attr)) return nullptr;
  size_t size = 0;
  return g_api->ReadOpAttr(attr, ORT_OP_ATTR_FLOAT, out, sizeof(float), &size);
}

OrtStatus* ReadString(const OrtNode* node, const char* name, std::string* out, bool required) {
  const OrtOpAttr* attr;
  if (!FindAttribute(node, name, &attr))
    return required ? Error(ORT_INVALID_GRAPH, std::string("missing attribute ") + name) : nullptr;
  size_t size = 0;
  OrtStatus* status = g_api->ReadOpAttr(attr, ORT_OP_ATTR_STRING, nullptr, 0, &size);
  if (status != nullptr) g_api->ReleaseStatus(status);  // asks for the size
  std::string value(size, '\0');
  NDP_RETURN_IF_ERROR(g_api->ReadOpAttr(attr, ORT_OP_ATTR_STRING, value.data(), size, &size));
  value.resize(size);
  while (!value.empty() && value.back() == '\0') value.pop_back();
  *out = value;
  return nullptr;
}

OrtStatus* ReadSpec(const OrtNode* node, MoESpec* spec) {
  NDP_RETURN_IF_ERROR(ReadString(node, attr::kLayer, &spec->layer, true));
  NDP_RETURN_IF_ERROR(ReadInt(node, attr::kNumExperts, &spec->num_experts, true));
  NDP_RETURN_IF_ERROR(ReadInt(node, attr::kTopK, &spec->top_k, true));
  NDP_RETURN_IF_ERROR(ReadInt(node, attr::kHidden, &spec->hidden, true));
  NDP_RETURN_IF_ERROR(ReadInt(node, attr::kFfn, &spec->ffn, true));
  NDP_RETURN_IF_ERROR(ReadInt(node, attr::kShards, &spec->shards, true));
  std::string activation, dtype = "float32";
  NDP_RETURN_IF_ERROR(ReadString(node, attr::kActivation, &activation, true));
  if (!ParseActivation(activation, &spec->activation))
    return Error(ORT_INVALID_GRAPH, spec->layer + ": unknown activation " + activation);
  NDP_RETURN_IF_ERROR(ReadFloat(node, attr::kActivationAlpha, &spec->alpha));
  NDP_RETURN_IF_ERROR(ReadFloat(node, attr::kActivationLimit, &spec->limit));
  NDP_RETURN_IF_ERROR(ReadFloat(node, attr::kActivationBeta, &spec->beta));
  int64_t flag = 0;
  NDP_RETURN_IF_ERROR(ReadInt(node, attr::kHasFirstBias, &flag, false));
  spec->has_first_bias = flag != 0;
  flag = 0;
  NDP_RETURN_IF_ERROR(ReadInt(node, attr::kHasDownBias, &flag, false));
  spec->has_down_bias = flag != 0;
  NDP_RETURN_IF_ERROR(ReadString(node, attr::kWeightDtype, &dtype, false));
  if (!ParseWeightDtype(dtype, &spec->weight_dtype))
    return Error(ORT_INVALID_GRAPH, spec->layer + ": unknown weight_dtype " + dtype);
  NDP_RETURN_IF_ERROR(ReadInt(node, attr::kQuantBlockSize, &spec->quant_block_size, false));
  flag = 0;
  NDP_RETURN_IF_ERROR(ReadInt(node, attr::kHasZeroPoints, &flag, false));
  spec->has_zero_points = flag != 0;
  for (auto [name, out] : {std::make_pair(attr::kFirstLayout, &spec->first_out_in),
                           std::make_pair(attr::kDownLayout, &spec->down_out_in)}) {
    std::string layout = "in_out";
    NDP_RETURN_IF_ERROR(ReadString(node, name, &layout, false));
    if (!ParseLayout(layout, out))
      return Error(ORT_INVALID_GRAPH, spec->layer + ": unknown " + name + " " + layout);
  }
  const std::string problem = spec->Validate();
  return problem.empty() ? nullptr : Error(ORT_INVALID_GRAPH, problem);
}

OrtStatus* NodeInputs(const OrtNode* node, std::vector<const OrtValueInfo*>* inputs) {
  size_t count = 0;
  NDP_RETURN_IF_ERROR(g_api->Node_GetNumInputs(node, &count));
  inputs->assign(count, nullptr);
  return count ? g_api->Node_GetInputs(node, inputs->data(), count) : nullptr;
}

OrtStatus* IsConstant(const OrtValueInfo* info, bool* constant) {
  *constant = false;
  return info ? g_api->ValueInfo_IsConstantInitializer(info, constant) : nullptr;
}

OrtStatus* TensorOf(const OrtValue* value, RawTensor* out) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  NDP_RETURN_IF_ERROR(g_api->GetTensorTypeAndShape(value, &info));
  ONNXTensorElementDataType type;
  size_t rank = 0;
  OrtStatus* status = g_api->GetTensorElementType(info, &type);
  if (status == nullptr) status = g_api->GetDimensionsCount(info, &rank);
  if (status == nullptr) {
    out->shape.assign(rank, 0);
    status = g_api->GetDimensions(info, out->shape.data(), rank);
  }
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  NDP_RETURN_IF_ERROR(status);
  out->elem_type = static_cast<int32_t>(type);
  return g_api->GetTensorData(value, &out->data);
}

// Bytes per element of the weight types the contract allows (0: another type, left to ONNX Runtime's value).
size_t ElementBytes(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
      return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
      return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
      return 1;
    default:
      return 0;
  }
}

// A weight held in an external-data file, mapped through `files` (weight_map.h): true with *out filled, or false
// (no external data, a location left to ONNX Runtime, a size that does not match the type) for ONNX Runtime's
// value to be used instead, whose loading then applies ONNX Runtime's own checks.
OrtStatus* MapExternalWeight(const OrtGraph* graph, const OrtValueInfo* info, WeightFileMap* files, RawTensor* out,
                             bool* mapped) {
  *mapped = false;
  OrtExternalInitializerInfo* external = nullptr;
  NDP_RETURN_IF_ERROR(g_api->ValueInfo_GetExternalInitializerInfo(info, &external));
  if (external == nullptr) return nullptr;
  const char* relative = g_api->ExternalInitializerInfo_GetFilePath(external);
  const std::string location = relative ? relative : "";
  const int64_t offset = g_api->ExternalInitializerInfo_GetFileOffset(external);
  const size_t bytes = g_api->ExternalInitializerInfo_GetByteSize(external);
  g_api->ReleaseExternalInitializerInfo(external);
  const char* model_path = nullptr;
  NDP_RETURN_IF_ERROR(g_api->Graph_GetModelPath(graph, &model_path));
  if (model_path == nullptr || *model_path == '\0') return nullptr;  // a model from bytes: ORT knows the folder
  const std::string path = ExternalDataPath(model_path, location);
  if (path.empty()) return nullptr;
  const OrtTypeInfo* type_info = nullptr;
  NDP_RETURN_IF_ERROR(g_api->GetValueInfoTypeInfo(info, &type_info));
  const OrtTensorTypeAndShapeInfo* tensor_info = nullptr;
  NDP_RETURN_IF_ERROR(g_api->CastTypeInfoToTensorInfo(type_info, &tensor_info));
  if (tensor_info == nullptr) return nullptr;
  ONNXTensorElementDataType type;
  size_t rank = 0;
  NDP_RETURN_IF_ERROR(g_api->GetTensorElementType(tensor_info, &type));
  NDP_RETURN_IF_ERROR(g_api->GetDimensionsCount(tensor_info, &rank));
  RawTensor tensor;
  tensor.elem_type = static_cast<int32_t>(type);
  tensor.shape.assign(rank, 0);
  NDP_RETURN_IF_ERROR(g_api->GetDimensions(tensor_info, tensor.shape.data(), rank));
  size_t elements = 1;
  for (int64_t dim : tensor.shape) {
    if (dim < 0) return nullptr;
    elements *= static_cast<size_t>(dim);
  }
  if (ElementBytes(type) == 0 || elements * ElementBytes(type) != bytes) return nullptr;
  if (!files->Map(path, offset, bytes, &tensor.data).empty()) return nullptr;  // ONNX Runtime reports it
  tensor.lasting = true;  // the compiled node keeps the mapping
  *out = std::move(tensor);
  *mapped = true;
  return nullptr;
}

// ---- the compiled node -------------------------------------------------------------------------------------
struct CompiledNode {
  std::shared_ptr<WeightFileMap> files;  // the external data the kernel reads scales from (weight_map.h)
  MoEKernel kernel;
  std::shared_ptr<RoutingLog> log;  // null when routing capture is off
  int32_t layer = 0;
};

struct ParallelContext {
  const std::function<void(size_t)>* fn;
  std::mutex mutex;
  OrtStatus* error = nullptr;  // the first task's exception, as a status
};

// A task of ONNX Runtime's intra-op pool: called from ONNX Runtime's threads, so nothing may escape it.
void RunTask(void* data, size_t index) noexcept {
  auto* context = static_cast<ParallelContext*>(data);
  try {
    InjectFault("compute_task");
    (*context->fn)(index);
  } catch (...) {
    OrtStatus* status = StatusFromException(g_api, "compute_task");
    std::lock_guard<std::mutex> lock(context->mutex);
    if (context->error == nullptr) {
      context->error = status;
    } else {
      g_api->ReleaseStatus(status);
    }
  }
}

template <typename T>
void ToFloat(const T* in, float* out, size_t n, float (*convert)(uint16_t)) {
  for (size_t i = 0; i < n; ++i) out[i] = convert(in[i]);
}

thread_local std::vector<float> t_x, t_w, t_out;
thread_local std::vector<int64_t> t_ids;

OrtStatus* ComputeNode(const CompiledNode& node, OrtKernelContext* context) {
  const MoESpec& spec = node.kernel.spec();
  const OrtValue* inputs[3] = {nullptr, nullptr, nullptr};
  RawTensor x, ids, w;
  RawTensor* tensors[3] = {&x, &ids, &w};
  for (size_t i = 0; i < 3; ++i) {
    NDP_RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, i, &inputs[i]));
    if (inputs[i] == nullptr) return Error(ORT_INVALID_ARGUMENT, spec.layer + ": missing input");
    NDP_RETURN_IF_ERROR(TensorOf(inputs[i], tensors[i]));
  }
  if (x.shape.empty() || x.shape.back() != spec.hidden)
    return Error(ORT_INVALID_ARGUMENT, spec.layer + ": hidden state's last dimension must be " +
                                           std::to_string(spec.hidden));
  const size_t tokens = x.element_count() / static_cast<size_t>(spec.hidden);
  const size_t slots = tokens * static_cast<size_t>(spec.top_k);
  if (ids.element_count() != slots || w.element_count() != slots)
    return Error(ORT_INVALID_ARGUMENT, spec.layer + ": expected " + std::to_string(spec.top_k) +
                                           " expert ids and routing weights per token");
  OrtValue* output = nullptr;
  NDP_RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 0, x.shape.data(), x.shape.size(), &output));
  void* out_data = nullptr;
  NDP_RETURN_IF_ERROR(g_api->GetTensorMutableData(output, &out_data));
  if (tokens == 0) {  // still recorded: each run's report needs every layer's record, a zero-token one too
    if (node.log) {
      const size_t experts = static_cast<size_t>(spec.num_experts);
      node.log->Append(RoutingRecord{CurrentRunId(), node.layer, 0, std::vector<int32_t>(experts)});
    }
    return nullptr;
  }

  const size_t hidden_elems = tokens * static_cast<size_t>(spec.hidden);
  const float* xf = static_cast<const float*>(x.data);
  float* outf = static_cast<float*>(out_data);
  if (x.elem_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    if (x.elem_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 && x.elem_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16)
      return Error(ORT_INVALID_ARGUMENT, spec.layer + ": hidden state must be float32, float16 or bfloat16");
    t_x.resize(hidden_elems);
    t_out.resize(hidden_elems);
    ToFloat(static_cast<const uint16_t*>(x.data), t_x.data(), hidden_elems,
            x.elem_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? HalfToFloat : BFloat16ToFloat);
    xf = t_x.data();
    outf = t_out.data();
  }
  const float* wf = static_cast<const float*>(w.data);
  if (w.elem_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    if (w.elem_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 && w.elem_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16)
      return Error(ORT_INVALID_ARGUMENT, spec.layer + ": routing weights must be a float tensor");
    t_w.resize(slots);
    ToFloat(static_cast<const uint16_t*>(w.data), t_w.data(), slots,
            w.elem_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? HalfToFloat : BFloat16ToFloat);
    wf = t_w.data();
  }
  const int64_t* idp = static_cast<const int64_t*>(ids.data);
  if (ids.elem_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32) {
    t_ids.resize(slots);
    const auto* src = static_cast<const int32_t*>(ids.data);
    for (size_t i = 0; i < slots; ++i) t_ids[i] = src[i];
    idp = t_ids.data();
  } else if (ids.elem_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
    return Error(ORT_INVALID_ARGUMENT, spec.layer + ": expert ids must be int64 or int32");
  }

  OrtStatus* parallel_error = nullptr;
  ParallelFor parallel_for = [context, &parallel_error](size_t n, const std::function<void(size_t)>& fn) {
    if (n == 1) {
      fn(0);
      return;
    }
    ParallelContext data;
    data.fn = &fn;
    OrtStatus* status = g_api->KernelContext_ParallelFor(context, RunTask, n, n, &data);
    for (OrtStatus* found : {status, data.error}) {
      if (found != nullptr && parallel_error == nullptr) parallel_error = found;
      else if (found != nullptr) g_api->ReleaseStatus(found);
    }
  };
  const std::string problem = node.kernel.Compute(xf, idp, wf, static_cast<int64_t>(tokens), outf, parallel_for);
  if (parallel_error != nullptr) return parallel_error;
  if (!problem.empty()) return Error(ORT_INVALID_ARGUMENT, problem);

  if (outf != out_data) {
    auto* dst = static_cast<uint16_t*>(out_data);
    const bool half = x.elem_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    for (size_t i = 0; i < hidden_elems; ++i) dst[i] = half ? FloatToHalf(outf[i]) : FloatToBFloat16(outf[i]);
  }
  if (node.log) {
    // the kernel checked every id against num_experts
    RoutingRecord record{CurrentRunId(), node.layer, static_cast<int32_t>(tokens),
                         std::vector<int32_t>(static_cast<size_t>(spec.num_experts))};
    for (size_t i = 0; i < slots; ++i) ++record.counts[static_cast<size_t>(idp[i])];
    node.log->Append(std::move(record));
  }
  return nullptr;
}

struct NodeComputeInfo : OrtNodeComputeInfo {
  explicit NodeComputeInfo(std::unique_ptr<CompiledNode> compiled) : OrtNodeComputeInfo{}, node(std::move(compiled)) {
    ort_version_supported = kApiVersion;
    CreateState = CreateStateImpl;
    Compute = ComputeImpl;
    ReleaseState = ReleaseStateImpl;
  }
  static OrtStatus* ORT_API_CALL CreateStateImpl(OrtNodeComputeInfo* self, OrtNodeComputeContext*,
                                                 void** state) noexcept {
    *state = static_cast<NodeComputeInfo*>(self)->node.get();
    return nullptr;
  }
  static OrtStatus* ORT_API_CALL ComputeImpl(OrtNodeComputeInfo*, void* state, OrtKernelContext* context) noexcept {
    NDP_GUARD(g_api, "compute", return ComputeNode(*static_cast<CompiledNode*>(state), context);)
  }
  static void ORT_API_CALL ReleaseStateImpl(OrtNodeComputeInfo*, void*) noexcept {}
  std::unique_ptr<CompiledNode> node;
};

// ---- the EP ------------------------------------------------------------------------------------------------
std::string SessionOption(const OrtSessionOptions* options, const std::string& key, const std::string& fallback) {
  const std::string full = kOptionPrefix + key;
  int has = 0;
  OrtStatus* status = g_api->HasSessionConfigEntry(options, full.c_str(), &has);
  if (status != nullptr) {
    g_api->ReleaseStatus(status);
    return fallback;
  }
  if (!has) return fallback;
  size_t size = 0;
  status = g_api->GetSessionConfigEntry(options, full.c_str(), nullptr, &size);
  if (status != nullptr) g_api->ReleaseStatus(status);
  std::string value(size, '\0');
  status = g_api->GetSessionConfigEntry(options, full.c_str(), value.data(), &size);
  if (status != nullptr) {
    g_api->ReleaseStatus(status);
    return fallback;
  }
  value.resize(size ? size - 1 : 0);
  return value;
}

struct NdpEp : OrtEp {
  NdpEp(const std::string& session_key, size_t capacity, bool record) : OrtEp{} {  // unset entries stay null
    ort_version_supported = kApiVersion;
    GetName = [](const OrtEp*) noexcept -> const char* { return kEpName; };
    GetCapability = GetCapabilityImpl;
    Compile = CompileImpl;
    ReleaseNodeComputeInfos = ReleaseNodeComputeInfosImpl;
    OnRunStart = [](OrtEp*, const OrtRunOptions* run_options) noexcept -> OrtStatus* {
      NDP_GUARD(g_api, "run_start", {
        // A caller that tags its runs (ndp_ep.InferenceSession does) finds the tag on the run's records.
        const char* tag = run_options ? g_api->GetRunConfigEntry(run_options, kRunTagKey) : nullptr;
        char* end = nullptr;
        const long long value = tag ? std::strtoll(tag, &end, 10) : 0;
        BeginRun(tag && end != tag && *end == '\0' && value > 0 ? value : 0);
        return nullptr;
      })
    };
    if (record) log = OpenRoutingLog(session_key, capacity);
  }

  static OrtStatus* ORT_API_CALL GetCapabilityImpl(OrtEp* self, const OrtGraph* graph,
                                                   OrtEpGraphSupportInfo* support) noexcept {
    NDP_GUARD(g_api, "get_capability", return ClaimNodes(self, graph, support);)
  }

  static OrtStatus* ClaimNodes(OrtEp* self, const OrtGraph* graph, OrtEpGraphSupportInfo* support) {
    size_t count = 0;
    NDP_RETURN_IF_ERROR(g_api->Graph_GetNumNodes(graph, &count));
    std::vector<const OrtNode*> nodes(count);
    if (count) NDP_RETURN_IF_ERROR(g_api->Graph_GetNodes(graph, nodes.data(), count));
    for (const OrtNode* node : nodes) {
      const char* domain = nullptr;
      const char* op_type = nullptr;
      NDP_RETURN_IF_ERROR(g_api->Node_GetDomain(node, &domain));
      NDP_RETURN_IF_ERROR(g_api->Node_GetOperatorType(node, &op_type));
      if (std::strcmp(domain, kDomain) != 0 || std::strcmp(op_type, kOpType) != 0) continue;
      MoESpec spec;
      NDP_RETURN_IF_ERROR(ReadSpec(node, &spec));  // a node breaking the contract fails the session, loudly
      std::vector<const OrtValueInfo*> inputs;
      NDP_RETURN_IF_ERROR(NodeInputs(node, &inputs));
      if (inputs.size() != 3 + spec.weight_input_count())
        return Error(ORT_INVALID_GRAPH, spec.layer + ": expected " + std::to_string(3 + spec.weight_input_count()) +
                                            " inputs, found " + std::to_string(inputs.size()));
      bool claimable = true;
      for (size_t i = 0; i < inputs.size() && claimable; ++i) {
        bool constant = false;
        NDP_RETURN_IF_ERROR(IsConstant(inputs[i], &constant));
        claimable = (i < 3) ? !constant : constant;  // activations flow in, weights are constant initializers
      }
      if (!claimable) continue;
      OrtNodeFusionOptions options{};
      options.ort_version_supported = kApiVersion;
      options.drop_constant_initializers = true;  // Compile copies the weights into the kernel
      NDP_RETURN_IF_ERROR(g_ep_api->EpGraphSupportInfo_AddNodesToFuse(support, &node, 1, &options));
    }
    (void)self;
    return nullptr;
  }

  static OrtStatus* ORT_API_CALL CompileImpl(OrtEp* self, const OrtGraph** graphs, const OrtNode** /*fused*/,
                                             size_t count, OrtNodeComputeInfo** infos,
                                             OrtNode** /*ep_context_nodes*/) noexcept {
    auto* ep = static_cast<NdpEp*>(self);
    for (size_t g = 0; g < count; ++g) infos[g] = nullptr;
    try {
      InjectFault("compile");
      for (size_t g = 0; g < count; ++g) {
        infos[g] = nullptr;
        size_t n = 0;
        NDP_RETURN_IF_ERROR(g_api->Graph_GetNumNodes(graphs[g], &n));
        if (n != 1) return Error(ORT_EP_FAIL, "expected one ShardedMoEExperts node per fused graph");
        const OrtNode* node = nullptr;
        NDP_RETURN_IF_ERROR(g_api->Graph_GetNodes(graphs[g], &node, 1));
        auto compiled = std::make_unique<CompiledNode>();
        MoESpec spec;
        NDP_RETURN_IF_ERROR(ReadSpec(node, &spec));
        std::vector<const OrtValueInfo*> inputs;
        NDP_RETURN_IF_ERROR(NodeInputs(node, &inputs));
        std::vector<RawTensor> weights(inputs.size() - 3);
        auto files = std::make_shared<WeightFileMap>();  // external data, its pages dropped expert by expert
        compiled->files = files;
        for (size_t i = 3; i < inputs.size(); ++i) {
          bool mapped = false;
          NDP_RETURN_IF_ERROR(MapExternalWeight(graphs[g], inputs[i], files.get(), &weights[i - 3], &mapped));
          if (mapped) continue;
          const OrtValue* value = nullptr;
          NDP_RETURN_IF_ERROR(g_api->ValueInfo_GetInitializerValue(inputs[i], &value));
          if (value == nullptr) return Error(ORT_EP_FAIL, spec.layer + ": a weight is not an initializer");
          NDP_RETURN_IF_ERROR(TensorOf(value, &weights[i - 3]));
        }
        // Quantized experts multiply as the loading ONNX Runtime's own QMoE kernel would, read once per session
        // (ONNX Runtime reads its environment variable when it creates the QMoE kernel, once per session too).
        QuantCompute compute;
        std::string problem =
            QuantComputeFor(spec, g_ort_major, g_ort_minor, std::getenv(kQMoEQNBitGemmEnv), &compute);
        if (!problem.empty()) return Error(ORT_INVALID_ARGUMENT, spec.layer + ": " + problem);
        PanelIsa isa;
        problem = ChoosePanelIsa(std::getenv(kKernelIsaEnv), &isa);
        if (!problem.empty()) return Error(ORT_INVALID_ARGUMENT, problem);
        Packing packing;
        problem = ParsePacking(std::getenv(kPackingEnv), &packing);
        if (!problem.empty()) return Error(ORT_INVALID_ARGUMENT, problem);
        // the kernel keeps the callback (experts packed on first routing drop their pages then); the node keeps
        // the mapping, so the callback holds only a plain pointer to it
        WeightFileMap* file_map = files.get();
        problem = compiled->kernel.Load(
            spec, weights, compute, isa,
            [file_map](const RawTensor& t) {
              file_map->Release(t.data,
                                t.element_count() * ElementBytes(static_cast<ONNXTensorElementDataType>(t.elem_type)));
            },
            packing);
        if (!problem.empty()) return Error(ORT_INVALID_GRAPH, problem);
        const char* name = nullptr;
        NDP_RETURN_IF_ERROR(g_api->Node_GetName(node, &name));
        if (ep->log) {
          compiled->log = ep->log;
          compiled->layer = ep->log->AddLayer(name ? name : spec.layer);
        }
        infos[g] = new NodeComputeInfo(std::move(compiled));
      }
    } catch (...) {
      for (size_t g = 0; g < count; ++g) {
        delete static_cast<NodeComputeInfo*>(infos[g]);
        infos[g] = nullptr;
      }
      return StatusFromException(g_api, "compile");
    }
    return nullptr;
  }

  static void ORT_API_CALL ReleaseNodeComputeInfosImpl(OrtEp*, OrtNodeComputeInfo** infos, size_t count) noexcept {
    for (size_t i = 0; i < count; ++i) delete static_cast<NodeComputeInfo*>(infos[i]);
  }

  std::shared_ptr<RoutingLog> log;
};

// The output has the hidden state's type and shape. Unknown dims without a name get a fresh symbolic name
// (ONNX Runtime would otherwise take the -1 of an unknown dim as its value).
OrtStatus* InferOutputShapeOf(OrtShapeInferContext* context);

OrtStatusPtr ORT_API_CALL InferOutputShape(const OrtCustomOp*, OrtShapeInferContext* context) noexcept {
  NDP_GUARD(g_api, "infer_shape", return InferOutputShapeOf(context);)
}

OrtStatus* InferOutputShapeOf(OrtShapeInferContext* context) {
  static std::atomic<uint64_t> fresh{0};
  OrtTensorTypeAndShapeInfo* hidden = nullptr;  // owned by the context
  NDP_RETURN_IF_ERROR(g_api->ShapeInferContext_GetInputTypeShape(context, 0, &hidden));
  ONNXTensorElementDataType type;
  size_t rank = 0;
  NDP_RETURN_IF_ERROR(g_api->GetTensorElementType(hidden, &type));
  NDP_RETURN_IF_ERROR(g_api->GetDimensionsCount(hidden, &rank));
  std::vector<int64_t> dims(rank);
  std::vector<const char*> names(rank, nullptr);
  NDP_RETURN_IF_ERROR(g_api->GetDimensions(hidden, dims.data(), rank));
  NDP_RETURN_IF_ERROR(g_api->GetSymbolicDimensions(hidden, names.data(), rank));
  std::vector<std::string> storage(rank);
  std::vector<const char*> params(rank);
  for (size_t i = 0; i < rank; ++i) {
    storage[i] = names[i] ? names[i] : "";
    if (dims[i] < 0 && storage[i].empty()) storage[i] = "ndp_ep_dim" + std::to_string(fresh++);
    params[i] = storage[i].c_str();
  }
  OrtTensorTypeAndShapeInfo* out = nullptr;
  NDP_RETURN_IF_ERROR(g_api->CreateTensorTypeAndShapeInfo(&out));
  OrtStatus* status = g_api->SetTensorElementType(out, type);
  if (status == nullptr) status = g_api->SetDimensions(out, dims.data(), rank);
  if (status == nullptr) status = g_api->SetSymbolicDimensions(out, params.data(), rank);
  if (status == nullptr) status = g_api->ShapeInferContext_SetOutputTypeShape(context, 0, out);
  g_api->ReleaseTensorTypeAndShapeInfo(out);
  return status;
}

// ---- the op's schema: a placeholder custom op (the EP compiles the node; this kernel never runs) ----------
struct SchemaOp : OrtCustomOp {
  SchemaOp() {
    std::memset(static_cast<OrtCustomOp*>(this), 0, sizeof(OrtCustomOp));
    version = kApiVersion;
    CreateKernel = [](const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*) -> void* {
      static int placeholder;
      return &placeholder;
    };
    GetName = [](const OrtCustomOp*) -> const char* { return kOpType; };
    GetExecutionProviderType = [](const OrtCustomOp*) -> const char* { return kEpName; };
    GetInputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; };
    GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 1; };
    GetOutputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; };
    GetOutputTypeCount = [](const OrtCustomOp*) -> size_t { return 1; };
    KernelCompute = [](void*, OrtKernelContext*) {};
    KernelDestroy = [](void*) {};
    GetInputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_VARIADIC; };
    GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
    GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
    GetVariadicInputMinArity = [](const OrtCustomOp*) { return 3; };
    GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 0; };
    GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
    GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 0; };
    InferOutputShapeFn = InferOutputShape;
    GetStartVersion = [](const OrtCustomOp*) { return kOpsetVersion; };
    GetEndVersion = [](const OrtCustomOp*) { return kOpsetVersion; };
  }
};

SchemaOp g_schema_op;

OrtStatus* MakeSchemaDomain(OrtCustomOpDomain** domain) {
  NDP_RETURN_IF_ERROR(g_api->CreateCustomOpDomain(kDomain, domain));
  return g_api->CustomOpDomain_Add(*domain, &g_schema_op);
}

// ---- the factory -------------------------------------------------------------------------------------------
struct NdpEpFactory : OrtEpFactory {
  explicit NdpEpFactory(uint32_t version) {
    std::memset(static_cast<OrtEpFactory*>(this), 0, sizeof(OrtEpFactory));
    ort_version_supported = version;
    GetName = [](const OrtEpFactory*) noexcept -> const char* { return kEpName; };
    GetVendor = [](const OrtEpFactory*) noexcept -> const char* { return kVendor; };
    GetVendorId = [](const OrtEpFactory*) noexcept -> uint32_t { return 0; };
    GetVersion = [](const OrtEpFactory*) noexcept -> const char* { return NDP_EP_VERSION; };
    GetSupportedDevices = GetSupportedDevicesImpl;
    CreateEp = CreateEpImpl;
    ReleaseEp = [](OrtEpFactory*, OrtEp* ep) noexcept { delete static_cast<NdpEp*>(ep); };
    // The optional 1.23 entries: ONNX Runtime calls some of them unconditionally. CPU memory, no streams.
    ValidateCompiledModelCompatibilityInfo = [](OrtEpFactory*, const OrtHardwareDevice* const*, size_t, const char*,
                                                OrtCompiledModelCompatibility* out) noexcept -> OrtStatus* {
      *out = OrtCompiledModelCompatibility_EP_NOT_APPLICABLE;
      return nullptr;
    };
    CreateAllocator = [](OrtEpFactory*, const OrtMemoryInfo*, const OrtKeyValuePairs*,
                         OrtAllocator** allocator) noexcept -> OrtStatus* {
      *allocator = nullptr;
      return nullptr;
    };
    ReleaseAllocator = [](OrtEpFactory*, OrtAllocator*) noexcept {};
    CreateDataTransfer = [](OrtEpFactory*, OrtDataTransferImpl** transfer) noexcept -> OrtStatus* {
      *transfer = nullptr;
      return nullptr;
    };
    IsStreamAware = [](const OrtEpFactory*) noexcept { return false; };
    CreateSyncStreamForDevice = [](OrtEpFactory*, const OrtMemoryDevice*, const OrtKeyValuePairs*,
                                   OrtSyncStreamImpl** stream) noexcept -> OrtStatus* {
      *stream = nullptr;
      return nullptr;
    };
    if (version >= kSchemaApiVersion) {
      GetHardwareDeviceIncompatibilityDetails = [](OrtEpFactory*, const OrtHardwareDevice*,
                                                   OrtDeviceEpIncompatibilityDetails*) noexcept -> OrtStatus* {
        return nullptr;  // every CPU is supported
      };
      CreateExternalResourceImporterForDevice = [](OrtEpFactory*, const OrtEpDevice*,
                                                   OrtExternalResourceImporterImpl** out) noexcept -> OrtStatus* {
        *out = nullptr;
        return nullptr;
      };
      GetNumCustomOpDomains = [](OrtEpFactory*, size_t* n) noexcept -> OrtStatus* {
        *n = 1;
        return nullptr;
      };
      GetCustomOpDomains = [](OrtEpFactory* self, OrtCustomOpDomain** domains, size_t n) noexcept -> OrtStatus* {
        NDP_GUARD(g_api, "custom_op_domains", {
          auto* factory = static_cast<NdpEpFactory*>(self);
          if (n < 1) return Error(ORT_INVALID_ARGUMENT, "no room for the ndp_ep op domain");
          std::lock_guard<std::mutex> lock(factory->mutex);
          if (factory->domain == nullptr) NDP_RETURN_IF_ERROR(MakeSchemaDomain(&factory->domain));
          domains[0] = factory->domain;
          return nullptr;
        })
      };
    }
  }
  ~NdpEpFactory() {
    if (domain != nullptr) g_api->ReleaseCustomOpDomain(domain);
  }

  static OrtStatus* ORT_API_CALL GetSupportedDevicesImpl(OrtEpFactory* self, const OrtHardwareDevice* const* devices,
                                                         size_t num_devices, OrtEpDevice** ep_devices,
                                                         size_t max_ep_devices, size_t* num_ep_devices) noexcept {
    *num_ep_devices = 0;
    NDP_GUARD(g_api, "supported_devices", {
      for (size_t i = 0; i < num_devices && *num_ep_devices < max_ep_devices; ++i) {
        if (g_api->HardwareDevice_Type(devices[i]) != OrtHardwareDeviceType_CPU) continue;
        OrtEpDevice* device = nullptr;
        NDP_RETURN_IF_ERROR(g_ep_api->CreateEpDevice(self, devices[i], nullptr, nullptr, &device));
        ep_devices[(*num_ep_devices)++] = device;
        break;  // one CPU device: the host that simulates the GPU + NDP system
      }
      return nullptr;
    })
  }

  static OrtStatus* ORT_API_CALL CreateEpImpl(OrtEpFactory*, const OrtHardwareDevice* const*,
                                              const OrtKeyValuePairs* const*, size_t,
                                              const OrtSessionOptions* options, const OrtLogger*,
                                              OrtEp** ep) noexcept {
    *ep = nullptr;
    try {
      InjectFault("create_ep");
      const std::string key = SessionOption(options, "session_key", "");
      const std::string capacity_text = SessionOption(options, "routing_capacity", "");
      size_t capacity = kDefaultRoutingCapacity;
      if (!capacity_text.empty()) {
        char* end = nullptr;
        const long long value = std::strtoll(capacity_text.c_str(), &end, 10);
        if (end == capacity_text.c_str() || *end != '\0' || value < 1)
          return Error(ORT_INVALID_ARGUMENT, "EP option routing_capacity must be a positive integer, got '" +
                                                 capacity_text + "'");
        capacity = static_cast<size_t>(value);
      }
      const bool record = SessionOption(options, "record_routing", "1") != "0";
      *ep = new NdpEp(key, capacity, record);
      return nullptr;
    } catch (...) {
      return StatusFromException(g_api, "create_ep");
    }
  }

  std::mutex mutex;
  OrtCustomOpDomain* domain = nullptr;
};

bool InitApi(const OrtApiBase* base) {
  if (g_api != nullptr) return true;
  const OrtApi* api = base->GetApi(kApiVersion);
  if (api == nullptr) return false;
  g_runtime_api = base->GetApi(kSchemaApiVersion) != nullptr ? kSchemaApiVersion : kApiVersion;
  const char* version = base->GetVersionString();  // "1.32.0"
  if (version == nullptr || std::sscanf(version, "%d.%d", &g_ort_major, &g_ort_minor) != 2)
    g_ort_major = g_ort_minor = 0;  // unknown: taken as older than any QMoE behaviour QuantComputeFor knows
  g_api = api;
  g_ep_api = api->GetEpApi();
  ReadInjectedFault();
  return g_ep_api != nullptr;
}

}  // namespace
}  // namespace ndp

#define NDP_EXPORT extern "C" __attribute__((visibility("default")))

NDP_EXPORT OrtStatus* CreateEpFactories(const char* /*registered_name*/, const OrtApiBase* ort_api_base,
                                        const OrtLogger* /*default_logger*/, OrtEpFactory** factories,
                                        size_t max_factories, size_t* num_factories) {
  *num_factories = 0;
  if (!ndp::InitApi(ort_api_base)) return nullptr;  // this ONNX Runtime is older than 1.23: no factory
  NDP_GUARD(ndp::g_api, "create_factories", {
    if (max_factories < 1)
      return ndp::Error(ORT_INVALID_ARGUMENT, "ONNX Runtime offered no room for the NdpExecutionProvider factory");
    factories[0] = new ndp::NdpEpFactory(ndp::g_runtime_api);
    *num_factories = 1;
    return nullptr;
  })
}

NDP_EXPORT OrtStatus* ReleaseEpFactory(OrtEpFactory* factory) {
  delete static_cast<ndp::NdpEpFactory*>(factory);  // destructors throw nothing
  return nullptr;
}

// SessionOptions.register_custom_ops_library(path): the op's schema for runtimes whose EP factories cannot
// supply it (onnxruntime 1.23).
NDP_EXPORT OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* ort_api_base) {
  if (!ndp::InitApi(ort_api_base)) return nullptr;
  NDP_GUARD(ndp::g_api, "register_custom_ops", {
    // ONNX Runtime does not take ownership: the domain must outlive every session made with these options, so
    // it lives (one per call, a few bytes) until the process ends.
    OrtCustomOpDomain* domain = nullptr;
    NDP_RETURN_IF_ERROR(ndp::MakeSchemaDomain(&domain));
    return ndp::g_api->AddCustomOpDomain(options, domain);
  })
}

// The ORT API level the factory was created for (23, or 24 when it also supplies the op schema).
NDP_EXPORT int ndp_ep_factory_api_version() { return static_cast<int>(ndp::g_runtime_api); }
NDP_EXPORT const char* ndp_ep_version() { return NDP_EP_VERSION; }
// Experts packed by every session of the process so far (NDP_EP_PACK_EXPERTS; tests of the work runs do).
NDP_EXPORT int64_t ndp_ep_experts_packed() { return ndp::ExpertsPackedTotal(); }
