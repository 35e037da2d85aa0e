// NcclCommunicator's set-up through the key-value store and its collectives,
// waited on until done, failed, timed out or aborted (nccl_communicator.h).
#include "worker/collective/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace lockstep::worker {
namespace {

constexpr char kUniqueIdKey[] = "nccl_unique_id";

absl::Status CudaError(cudaError_t error, absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

ncclDataType_t NcclType(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat16:
      return ncclFloat16;
  }
  return ncclFloat32;
}

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;  // one float on the device, for Barrier
};

int NcclCommunicator::DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error of a missing driver
    return 0;
  }
  return count;
}

NcclCommunicator::NcclCommunicator(Options options, std::unique_ptr<Impl> impl)
    : options_(std::move(options)), impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Connect(
    KeyValueClient* kv, const Options& options) {
  if (DeviceCount() <= options.device) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", options.rank, " wants CUDA device ",
                     options.device, " but this worker sees ", DeviceCount(),
                     "; use the gloo backend on CPU workers"));
  }
  cudaError_t error = cudaSetDevice(options.device);
  if (error != cudaSuccess) return CudaError(error, "cudaSetDevice");

  ncclUniqueId id;
  if (options.rank == 0) {
    ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) {
      return absl::UnavailableError(
          absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(result)));
    }
    RETURN_IF_ERROR(
        kv->Set(kUniqueIdKey, std::string(id.internal, sizeof(id.internal))));
  } else {
    ASSIGN_OR_RETURN(std::string bytes, kv->Get(kUniqueIdKey, options.timeout));
    if (bytes.size() != sizeof(id.internal)) {
      return absl::DataLossError(
          "the NCCL unique id in the key-value store is malformed");
    }
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }

  auto impl = std::make_unique<Impl>();
  error = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
  if (error != cudaSuccess) return CudaError(error, "cudaStreamCreate");
  error = cudaMalloc(&impl->scratch, sizeof(float));
  if (error != cudaSuccess) return CudaError(error, "cudaMalloc");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so initialization can be abandoned at the deadline
  ncclResult_t result = ncclCommInitRankConfig(&impl->comm, options.size, id,
                                               options.rank, &config);
  std::unique_ptr<NcclCommunicator> comm(
      new NcclCommunicator(options, std::move(impl)));
  if (result != ncclSuccess && result != ncclInProgress) {
    return absl::UnavailableError(
        absl::StrCat("NCCL init of rank ", options.rank, " of ", options.size,
                     ": ", ncclGetErrorString(result)));
  }
  absl::Time deadline = absl::Now() + options.timeout;
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    ncclCommGetAsyncError(comm->impl_->comm, &state);
    if (state == ncclInProgress) {
      if (absl::Now() > deadline) {
        comm->AbortComm();
        return absl::DeadlineExceededError(absl::StrCat(
            "NCCL init of rank ", options.rank, " of ", options.size,
            " did not finish within ", absl::FormatDuration(options.timeout),
            "; a peer did not join"));
      }
      std::this_thread::yield();
    }
  }
  if (state != ncclSuccess) {
    return absl::UnavailableError(
        absl::StrCat("NCCL init of rank ", options.rank, " of ", options.size,
                     ": ", ncclGetErrorString(state)));
  }
  return comm;
}

NcclCommunicator::~NcclCommunicator() {
  if (aborted_) {
    AbortComm();
  } else if (impl_->comm != nullptr) {
    ncclCommDestroy(impl_->comm);
  }
  if (impl_->scratch != nullptr) cudaFree(impl_->scratch);
  if (impl_->stream != nullptr) cudaStreamDestroy(impl_->stream);
}

void NcclCommunicator::Abort() {
  // Only the flag: the thread waiting on the stream sees it and aborts the
  // NCCL communicator itself (or the destructor does), so the communicator
  // is never freed under a thread still polling it.
  aborted_ = true;
}

void NcclCommunicator::AbortComm() {
  aborted_ = true;
  if (impl_->comm != nullptr) {
    ncclCommAbort(impl_->comm);  // also frees a kernel stuck on a dead peer
    impl_->comm = nullptr;
  }
}

absl::Status NcclCommunicator::Wait(const char* what) {
  absl::Time deadline = absl::Now() + options_.timeout;
  while (true) {
    if (aborted_) {
      AbortComm();
      return absl::AbortedError(
          absl::StrCat(what, " on rank ", rank(), " was aborted"));
    }
    cudaError_t done = cudaStreamQuery(impl_->stream);
    if (done == cudaSuccess) return absl::OkStatus();
    if (done != cudaErrorNotReady) {
      AbortComm();
      return absl::UnavailableError(absl::StrCat(
          what, " failed on rank ", rank(), ": ", cudaGetErrorString(done)));
    }
    ncclResult_t state = ncclSuccess;
    if (impl_->comm != nullptr) ncclCommGetAsyncError(impl_->comm, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      AbortComm();
      return absl::UnavailableError(absl::StrCat(
          what, " failed on rank ", rank(), " of ", size(), ": ",
          ncclGetErrorString(state), "; a peer died or was cut off"));
    }
    if (absl::Now() > deadline) {
      AbortComm();
      return absl::DeadlineExceededError(absl::StrCat(
          what, " on rank ", rank(), " of ", size(), " did not finish within ",
          absl::FormatDuration(options_.timeout), "; a peer hung or died"));
    }
    std::this_thread::yield();
  }
}

absl::Status NcclCommunicator::AllReduceSum(void* data, size_t count,
                                            DataType type) {
  if (aborted_) return absl::AbortedError("the communicator was aborted");
  if (count == 0) return absl::OkStatus();
  ncclResult_t result = ncclAllReduce(data, data, count, NcclType(type),
                                      ncclSum, impl_->comm, impl_->stream);
  if (result != ncclSuccess && result != ncclInProgress) {
    return absl::UnavailableError(
        absl::StrCat("ncclAllReduce: ", ncclGetErrorString(result)));
  }
  return Wait("all-reduce");
}

absl::Status NcclCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (aborted_) return absl::AbortedError("the communicator was aborted");
  if (bytes == 0) return absl::OkStatus();
  ncclResult_t result = ncclBroadcast(data, data, bytes, ncclUint8, root,
                                      impl_->comm, impl_->stream);
  if (result != ncclSuccess && result != ncclInProgress) {
    return absl::UnavailableError(
        absl::StrCat("ncclBroadcast: ", ncclGetErrorString(result)));
  }
  return Wait("broadcast");
}

absl::Status NcclCommunicator::AllGather(const void* in, size_t bytes,
                                         void* out) {
  if (aborted_) return absl::AbortedError("the communicator was aborted");
  if (bytes == 0) return absl::OkStatus();
  ncclResult_t result =
      ncclAllGather(in, out, bytes, ncclUint8, impl_->comm, impl_->stream);
  if (result != ncclSuccess && result != ncclInProgress) {
    return absl::UnavailableError(
        absl::StrCat("ncclAllGather: ", ncclGetErrorString(result)));
  }
  return Wait("all-gather");
}

absl::Status NcclCommunicator::Barrier() {
  return AllReduceSum(impl_->scratch, 1, DataType::kFloat32);
}

}  // namespace lockstep::worker
