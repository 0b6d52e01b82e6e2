// Per-session routing capture: every compiled MoE node appends, per invocation, how many token slots each
// expert was routed (the counters the simulator consumes) to its session's RoutingLog; Python drains it after
// `run` through the C functions exported in routing_log.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

constexpr int64_t kRoutingMeta = 4;  // meta values per record (ndp_ep/ep.py RoutingReader.META)

// What ndp_ep_routing_take (routing_log.cc) reads and fills: the caller (ndp_ep/ep.py RoutingReader) builds one
// per session log and passes the same one to every call, so a call converts a single argument.
struct NdpRoutingTake {  // standard layout: ctypes.Structure _RoutingTake mirrors it
  const char* key;      // the session key naming the log
  int64_t* meta;        // [max_records * kRoutingMeta]: (run_id, layer, tokens, expert token total) per record
  int64_t max_records;  // records taken per call at most
  int32_t* counts;      // [max_records * width]: each record's expert counts, zero beyond its layer's experts
  int64_t width;
  int64_t dropped;  // out: records dropped so far because nobody drained the log (it keeps `routing_capacity`)
};

namespace ndp {

struct RoutingRecord {
  int64_t run_id;  // ONNX Runtime run this invocation belongs to (0 when unknown)
  int32_t layer;   // index into RoutingLog::layers()
  int32_t tokens;
  std::vector<int32_t> counts;  // [num_experts]: token slots routed to each expert (sums to tokens * top_k)
};

class RoutingLog {
 public:
  explicit RoutingLog(size_t capacity) : capacity_(capacity) {}

  int32_t AddLayer(const std::string& node_name);
  std::vector<std::string> layers() const;
  void Append(RoutingRecord record);
  // Moves up to max_records oldest records out of the log: meta gets (run_id, layer, tokens, the sum of its
  // counts) per record and counts one row of `width` per record (zero beyond the layer's experts); *dropped
  // the records dropped so far because nobody drained the log (Append keeps only the newest `capacity`).
  // Returns the number taken, or -1 when the oldest record has more experts than `width`.
  int64_t Take(int64_t* meta, size_t max_records, int32_t* counts, size_t width, uint64_t* dropped);

 private:
  mutable std::mutex mutex_;
  size_t capacity_;
  std::vector<std::string> layers_;
  std::deque<RoutingRecord> records_;
  uint64_t dropped_ = 0;
};

// Process-wide map from a session key (EP option `session_key`) to the logs of the live sessions opened with it.
std::shared_ptr<RoutingLog> OpenRoutingLog(const std::string& key, size_t capacity);
// The log of the one live session opened with `key`; null when there is none or, with *shared set, when several
// live sessions were opened with it (whose records cannot be told apart by key).
std::shared_ptr<RoutingLog> FindRoutingLog(const std::string& key, bool* shared);

// The run id of the calling thread, set by the EP's OnRunStart: the caller's tag (> 0) or, for untagged
// runs, a process-wide counter starting at kUntaggedRunBase.
constexpr int64_t kUntaggedRunBase = int64_t{1} << 40;
int64_t CurrentRunId();
void BeginRun(int64_t tag);  // tag <= 0: the one TagNextRun left for this thread, if any, else a new untagged id
void TagNextRun(int64_t tag);

// The bodies of the C interface's ndp_ep_routing_take / ndp_ep_routing_layers (routing_log.cc), which may throw.
int64_t RoutingTake(NdpRoutingTake* request);
int64_t RoutingLayers(const char* key, char* buffer, int64_t capacity);

}  // namespace ndp
