// Read-only mappings of a model's external-data files, from which the kernel packs the weights (at Compile, or
// each expert on its first routing: moe_kernel.h's Packing, the default for weights mapped here).
//
// Why: ONNX Runtime memory-maps an external initializer when the EP first asks for its value
// (ValueInfo_GetInitializerValue) and keeps the mapping, with every page packing read resident, until the graph
// handed to Compile is released, so the packed copy and the file's pages would both be resident at the end of
// Compile (twice the weights). The EP maps the files itself instead (the initializer's location comes from
// ValueInfo_GetExternalInitializerInfo) and drops each expert's pages as soon as the expert is packed; ONNX Runtime
// never maps them (the fused node drops its constant initializers), so Compile's peak is the packed weights plus
// one expert. The compiled node keeps the mapping: float32 scales are copied from it on their matrix's first product
// (panel_gemm.h), so, as with stock ONNX Runtime's QMoE, a session holds the scales of the experts runs routed to. As with ONNX Runtime's own
// mapping, the file must not be truncated while the session lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ndp {

class WeightFileMap {
 public:
  WeightFileMap() = default;
  WeightFileMap(const WeightFileMap&) = delete;
  WeightFileMap& operator=(const WeightFileMap&) = delete;
  ~WeightFileMap();

  // Points *data at bytes [offset, offset + bytes) of the file at `path`, mapped read-only (each file once).
  // Returns an error message ("" on success): the file cannot be opened or is not a regular file, or the range
  // lies outside it.
  std::string Map(const std::string& path, int64_t offset, size_t bytes, const void** data);

  // Drops the resident pages under [data, data + bytes) (rounded out to whole pages): they are read again from the
  // file should anything touch them. Does nothing for memory outside the mappings.
  void Release(const void* data, size_t bytes) const;

 private:
  struct File {
    std::string path;
    uint8_t* base = nullptr;
    size_t size = 0;
  };
  std::vector<File> files_;
};

// Drops the resident pages under [data, data + bytes) (rounded out to whole pages) of a read-only private file
// mapping (WeightFileMap's): they come back from the file if touched again. Only for such memory.
void DropFilePages(const void* data, size_t bytes);

// The directory part of a model path ("" for a bare file name), and `relative` joined to it; "" when `relative` is
// absolute or has a ".." component (those are left to ONNX Runtime's own checks).
std::string ExternalDataPath(const std::string& model_path, const std::string& relative);

}  // namespace ndp
