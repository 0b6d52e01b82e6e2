// The native boundary: no C++ exception ever leaves the library.
//
// ONNX Runtime calls the library through C function pointers (OrtEpFactory, OrtEp, OrtNodeComputeInfo, the schema
// op's shape inference, the thread-pool tasks of KernelContext_ParallelFor) and Python through ctypes: an exception
// unwinding into either is undefined behaviour, in practice std::terminate and SIGABRT. Every entry point runs its
// body under NDP_GUARD (or catches itself, for entry points without a status to return), which turns any
// exception, std::exception or not, into an OrtStatus carrying its message; building that status allocates
// nothing that can throw.
//
// Fault injection (tests/reliability/test_native_boundary.py): NDP_EP_INJECT_FAULT="<entry>:<kind>", read once
// when ONNX Runtime loads the library, makes entry point <entry> (a name passed to NDP_GUARD / InjectFault: create_ep,
// get_capability, compile, compute, compute_task, infer_shape, routing_take, ...) throw, kind "bad_alloc" a
// std::bad_alloc, "error" a std::runtime_error, "other" a value that is no std::exception.
#pragma once

#include <onnxruntime_c_api.h>

namespace ndp {

// The status for the exception being handled (call only inside a catch block); never throws.
OrtStatus* StatusFromException(const OrtApi* api, const char* entry) noexcept;

// Reads NDP_EP_INJECT_FAULT (once per process).
void ReadInjectedFault() noexcept;
// Throws as NDP_EP_INJECT_FAULT asks when it names `entry`; nothing otherwise (the common case: one compare).
void InjectFault(const char* entry);

}  // namespace ndp

// Runs `body` (statements ending in a return of an OrtStatus*), returning the status of any exception it throws.
#define NDP_GUARD(api, entry, body)                     \
  try {                                                 \
    ::ndp::InjectFault(entry);                          \
    body                                                \
  } catch (...) {                                       \
    return ::ndp::StatusFromException((api), (entry));  \
  }
