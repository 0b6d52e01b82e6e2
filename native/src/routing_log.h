// Per-session routing capture: every compiled MoE node appends the expert ids of each invocation to its
// session's RoutingLog; Python drains it after `run` through the C functions exported in routing_log.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ndp {

struct RoutingRecord {
  int64_t run_id;  // ONNX Runtime run this invocation belongs to (0 when unknown)
  int32_t layer;   // index into RoutingLog::layers()
  int32_t tokens;
  int32_t top_k;
  std::vector<int32_t> ids;  // [tokens * top_k]
};

class RoutingLog {
 public:
  explicit RoutingLog(size_t capacity) : capacity_(capacity) {}

  int32_t AddLayer(const std::string& node_name);
  std::vector<std::string> layers() const;
  void Append(RoutingRecord record);
  // Moves up to max_records oldest records whose ids fit into ids_capacity out of the log.
  size_t Take(int64_t* meta, size_t max_records, int32_t* ids, size_t ids_capacity);
  size_t pending(size_t* total_ids) const;
  uint64_t dropped() const;

 private:
  mutable std::mutex mutex_;
  size_t capacity_;
  std::vector<std::string> layers_;
  std::deque<RoutingRecord> records_;
  size_t pending_ids_ = 0;
  uint64_t dropped_ = 0;
};

// Process-wide map from a session key (EP option `session_key`) to the session's log.
std::shared_ptr<RoutingLog> OpenRoutingLog(const std::string& key, size_t capacity);
std::shared_ptr<RoutingLog> FindRoutingLog(const std::string& key);

// The run id of the calling thread, set by the EP's OnRunStart: the caller's tag (> 0) or, for untagged
// runs, a process-wide counter starting at kUntaggedRunBase.
constexpr int64_t kUntaggedRunBase = int64_t{1} << 40;
int64_t CurrentRunId();
void BeginRun(int64_t tag);

}  // namespace ndp
