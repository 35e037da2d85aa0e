// The CUDA runtime calls behind cuda_events.h, on the legacy default stream
// (cudaStreamLegacy: stream 0 whatever the per-thread default stream
// setting of the code that includes this).
#include "worker/collective/cuda_events.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"

namespace lockstep::worker {
namespace {

absl::Status Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear a non-sticky error so later calls can go on
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

cudaEvent_t AsEvent(void* event) { return static_cast<cudaEvent_t>(event); }

}  // namespace

absl::StatusOr<void*> CreateCudaEvent() {
  cudaEvent_t event = nullptr;
  absl::Status status =
      Check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
            "cudaEventCreateWithFlags");
  if (!status.ok()) return status;
  return static_cast<void*>(event);
}

void DestroyCudaEvent(void* event) {
  if (event != nullptr) cudaEventDestroy(AsEvent(event));
}

absl::Status RecordCudaEventOnDefaultStream(void* event) {
  if (event == nullptr) return absl::InvalidArgumentError("no event");
  return Check(cudaEventRecord(AsEvent(event), cudaStreamLegacy),
               "cudaEventRecord");
}

absl::Status SynchronizeCudaEvent(void* event) {
  if (event == nullptr) return absl::InvalidArgumentError("no event");
  return Check(cudaEventSynchronize(AsEvent(event)), "cudaEventSynchronize");
}

absl::Status SetCudaDevice(int device) {
  return Check(cudaSetDevice(device), "cudaSetDevice");
}

absl::StatusOr<int> CurrentCudaDevice() {
  int device = 0;
  absl::Status status = Check(cudaGetDevice(&device), "cudaGetDevice");
  if (!status.ok()) return status;
  return device;
}

absl::Status SynchronizeCudaDevice() {
  return Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

absl::Status CopyOnDefaultCudaStream(void* to, const void* from, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return Check(
      cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, cudaStreamLegacy),
      "cudaMemcpyAsync");
}

}  // namespace lockstep::worker
