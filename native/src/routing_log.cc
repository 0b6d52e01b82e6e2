// Routing capture storage and its C interface for Python (ctypes on the library ONNX Runtime loaded).
#include "routing_log.h"

#include "boundary.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <numeric>

namespace ndp {
namespace {
std::mutex g_registry_mutex;
std::map<std::string, std::vector<std::weak_ptr<RoutingLog>>> g_registry;
std::atomic<int64_t> g_next_run_id{kUntaggedRunBase};
thread_local int64_t t_run_id = 0;
thread_local int64_t t_next_tag = 0;  // ndp_ep_tag_next_run: the tag of this thread's next run without one
}  // namespace

int32_t RoutingLog::AddLayer(const std::string& node_name) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < layers_.size(); ++i)
    if (layers_[i] == node_name) return static_cast<int32_t>(i);
  layers_.push_back(node_name);
  return static_cast<int32_t>(layers_.size() - 1);
}

std::vector<std::string> RoutingLog::layers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return layers_;
}

void RoutingLog::Append(RoutingRecord record) {
  std::lock_guard<std::mutex> lock(mutex_);
  records_.push_back(std::move(record));
  while (records_.size() > capacity_) {  // bounded: a session nobody reads keeps only the newest records
    records_.pop_front();
    ++dropped_;
  }
}

int64_t RoutingLog::Take(int64_t* meta, size_t max_records, int32_t* counts, size_t width, uint64_t* dropped) {
  std::lock_guard<std::mutex> lock(mutex_);
  *dropped = dropped_;
  size_t taken = 0;
  while (taken < max_records && !records_.empty()) {
    RoutingRecord& r = records_.front();
    if (r.counts.size() > width) return taken ? static_cast<int64_t>(taken) : -1;
    meta[kRoutingMeta * taken + 0] = r.run_id;
    meta[kRoutingMeta * taken + 1] = r.layer;
    meta[kRoutingMeta * taken + 2] = r.tokens;
    meta[kRoutingMeta * taken + 3] = std::accumulate(r.counts.begin(), r.counts.end(), int64_t{0});
    int32_t* row = counts + taken * width;
    std::memcpy(row, r.counts.data(), r.counts.size() * sizeof(int32_t));
    std::memset(row + r.counts.size(), 0, (width - r.counts.size()) * sizeof(int32_t));
    records_.pop_front();
    ++taken;
  }
  return static_cast<int64_t>(taken);
}

std::shared_ptr<RoutingLog> OpenRoutingLog(const std::string& key, size_t capacity) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  for (auto it = g_registry.begin(); it != g_registry.end();) {  // forget logs of closed sessions
    auto& logs = it->second;
    logs.erase(std::remove_if(logs.begin(), logs.end(), [](const auto& log) { return log.expired(); }), logs.end());
    it = logs.empty() ? g_registry.erase(it) : std::next(it);
  }
  auto log = std::make_shared<RoutingLog>(capacity);
  g_registry[key].push_back(log);
  return log;
}

std::shared_ptr<RoutingLog> FindRoutingLog(const std::string& key, bool* shared) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  *shared = false;
  auto it = g_registry.find(key);
  if (it == g_registry.end()) return nullptr;
  std::shared_ptr<RoutingLog> found;
  for (const auto& entry : it->second) {
    auto log = entry.lock();
    if (!log) continue;
    if (found) {
      *shared = true;
      return nullptr;
    }
    found = std::move(log);
  }
  return found;
}

int64_t CurrentRunId() { return t_run_id; }
void BeginRun(int64_t tag) {
  if (tag <= 0) tag = t_next_tag;
  t_next_tag = 0;
  t_run_id = tag > 0 ? tag : g_next_run_id.fetch_add(1);
}
void TagNextRun(int64_t tag) { t_next_tag = tag > 0 ? tag : 0; }

}  // namespace ndp

// ---- C interface for ndp_ep/_native.py -------------------------------------------------------------------
#define NDP_EXPORT extern "C" __attribute__((visibility("default")))

// Called by Python through ctypes: nothing may escape them (boundary.h); a C++ exception returns kRoutingFailed.
constexpr int64_t kRoutingFailed = -4;

// Moves up to request->max_records records out of the log of request->key (see NdpRoutingTake). Returns the
// records taken; -1 for an unknown key or bad arguments, -2 when the oldest record has more experts than
// request->width, -3 when several live sessions share the key, -4 when the library failed (out of memory).
NDP_EXPORT int64_t ndp_ep_routing_take(NdpRoutingTake* request) noexcept {
  try {
    ndp::InjectFault("routing_take");
    return ndp::RoutingTake(request);
  } catch (...) {
    return kRoutingFailed;
  }
}

int64_t ndp::RoutingTake(NdpRoutingTake* request) {
  if (!request || !request->key || request->max_records < 0 || request->width < 0) return -1;
  bool shared = false;
  auto log = ndp::FindRoutingLog(request->key, &shared);
  if (!log) return shared ? -3 : -1;
  uint64_t dropped = 0;
  const int64_t taken = log->Take(request->meta, static_cast<size_t>(request->max_records), request->counts,
                                  static_cast<size_t>(request->width), &dropped);
  request->dropped = static_cast<int64_t>(dropped);
  return taken < 0 ? -2 : taken;
}

// The compiled nodes' names, '\n'-separated, in layer-index order; returns the size needed (with the NUL), -1 for
// an unknown key, -3 when several live sessions share it, -4 when the library failed (out of memory).
NDP_EXPORT int64_t ndp_ep_routing_layers(const char* key, char* buffer, int64_t capacity) noexcept {
  try {
    ndp::InjectFault("routing_layers");
    return ndp::RoutingLayers(key, buffer, capacity);
  } catch (...) {
    return kRoutingFailed;
  }
}

int64_t ndp::RoutingLayers(const char* key, char* buffer, int64_t capacity) {
  if (key == nullptr) return -1;
  bool shared = false;
  auto log = ndp::FindRoutingLog(key, &shared);
  if (!log) return shared ? -3 : -1;
  std::string text;
  for (const auto& name : log->layers()) text += (text.empty() ? "" : "\n") + name;
  if (buffer && capacity > 0) {
    const size_t n = std::min(text.size(), static_cast<size_t>(capacity - 1));
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  return static_cast<int64_t>(text.size() + 1);
}

// The tag of the calling thread's next run whose RunOptions carry none (ONNX Runtime starts a run on the calling
// thread): a caller that must hand ONNX Runtime its user's own RunOptions (their `terminate` flag is watched on
// that object) tags the run this way; 0 clears it.
NDP_EXPORT void ndp_ep_tag_next_run(int64_t tag) noexcept { ndp::TagNextRun(tag); }
