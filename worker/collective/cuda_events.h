// CUDA runtime helpers for code that must not include CUDA headers (the
// trainer, which builds against a CPU-only or a CUDA LibTorch alike): events
// on the legacy default stream, where LibTorch computes, to hand a gradient
// bucket over to NcclCommunicator::WaitForEvent; the current device; copies.
// Built only with the NCCL backend (LOCKSTEP_HAVE_NCCL). An event is a
// `void*` holding a cudaEvent_t. Errors are Internal, with CUDA's text, or
// InvalidArgument for a null event.
//
// "Current device" is per thread (cudaSetDevice): call SetCudaDevice on each
// thread that records events or copies.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_CUDA_EVENTS_H_
#define LOCKSTEP_WORKER_COLLECTIVE_CUDA_EVENTS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lockstep::worker {

// A new event on the current device, without timing
// (cudaEventDisableTiming), never recorded yet. Free it with
// DestroyCudaEvent.
absl::StatusOr<void*> CreateCudaEvent();

// Frees an event of CreateCudaEvent; null is ignored. Safe while a stream
// still waits for it (CUDA releases it once that wait is over).
void DestroyCudaEvent(void* event);

// Records `event` on the legacy default stream (stream 0) of the current
// device, which must be the event's device: the event completes once all
// work enqueued there before this call (LibTorch's kernels and copies, a
// CopyOnDefaultCudaStream) has run. Returns at once.
absl::Status RecordCudaEventOnDefaultStream(void* event);

// Blocks until the work `event` captured at its latest record has run (at
// once if it was never recorded).
absl::Status SynchronizeCudaEvent(void* event);

// Makes `device` current on the calling thread.
absl::Status SetCudaDevice(int device);

// The calling thread's current device.
absl::StatusOr<int> CurrentCudaDevice();

// Blocks until all work on the current device, on every stream, has run.
absl::Status SynchronizeCudaDevice();

// Copies `bytes` from `from` to `to` (host or device memory, the direction
// taken from the pointers) on the legacy default stream of the current
// device, after the work enqueued there before it. With pinned or device
// memory it returns at once: keep both buffers alive and unchanged until the
// copy has run (record an event after it and wait for that, or
// SynchronizeCudaDevice). With pageable host memory it may return only once
// the copy has run.
absl::Status CopyOnDefaultCudaStream(void* to, const void* from, size_t bytes);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_CUDA_EVENTS_H_
