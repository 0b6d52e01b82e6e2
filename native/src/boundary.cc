// The native boundary (see boundary.h).
#include "boundary.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <new>
#include <stdexcept>

namespace ndp {
namespace {
char g_fault_entry[64] = "";  // empty: no injected fault
char g_fault_kind[16] = "";
bool g_fault_read = false;
}  // namespace

OrtStatus* StatusFromException(const OrtApi* api, const char* entry) noexcept {
  char message[512];
  try {
    throw;
  } catch (const std::bad_alloc&) {
    std::snprintf(message, sizeof message, "ndp-ep: %s: out of memory (an allocation failed)", entry);
  } catch (const std::exception& e) {
    std::snprintf(message, sizeof message, "ndp-ep: %s: %s", entry, e.what());
  } catch (...) {
    std::snprintf(message, sizeof message, "ndp-ep: %s: an unknown C++ exception", entry);
  }
  return api != nullptr ? api->CreateStatus(ORT_FAIL, message) : nullptr;
}

void ReadInjectedFault() noexcept {
  if (g_fault_read) return;
  g_fault_read = true;
  const char* value = std::getenv("NDP_EP_INJECT_FAULT");
  const char* colon = value ? std::strchr(value, ':') : nullptr;
  if (colon == nullptr || static_cast<size_t>(colon - value) >= sizeof g_fault_entry ||
      std::strlen(colon + 1) >= sizeof g_fault_kind)
    return;
  std::memcpy(g_fault_entry, value, static_cast<size_t>(colon - value));
  g_fault_entry[colon - value] = '\0';
  std::strcpy(g_fault_kind, colon + 1);
}

void InjectFault(const char* entry) {
  if (g_fault_entry[0] == '\0' || std::strcmp(entry, g_fault_entry) != 0) return;
  if (std::strcmp(g_fault_kind, "bad_alloc") == 0) throw std::bad_alloc();
  if (std::strcmp(g_fault_kind, "other") == 0) throw 42;
  throw std::runtime_error(std::string("injected fault at ") + entry);
}

}  // namespace ndp
