// NcclCommunicator's set-up through the key-value store, its collectives on
// device or staged host buffers, waited on until done, failed, timed out or
// aborted, and its stream's hand-off from the compute stream
// (nccl_communicator.h).
#include "worker/collective/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace lockstep::worker {
namespace {

constexpr char kUniqueIdKey[] = "nccl_unique_id";
// Staged regions start at multiples of this (NCCL prefers aligned buffers).
constexpr size_t kStagingAlignment = 256;
constexpr size_t kMinStagingBytes = 64 << 10;

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

// An enqueue call's result: ncclInProgress is no error (the enqueue goes on;
// Wait polls until it ended).
absl::Status Enqueued(const char* call, ncclResult_t result) {
  if (result == ncclSuccess || result == ncclInProgress) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat(call, ": ", ncclGetErrorString(result)));
}

size_t RoundUp(size_t bytes) {
  return (bytes + kStagingAlignment - 1) / kStagingAlignment *
         kStagingAlignment;
}

// Makes `device` current on the calling thread for its scope: the thread
// that issues the collectives may not be the one that connected.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device_) cudaSetDevice(device_);
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  const int device_;
  int previous_ = -1;
};

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* barrier = nullptr;  // one float on the device, for Barrier
  void* staging = nullptr;  // device copies of host buffers
  size_t staging_bytes = 0;
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

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const Options& options) {
  if (DeviceCount() <= options.device) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", options.rank, " wants CUDA device ",
                     options.device, " but this worker sees ", DeviceCount(),
                     "; use the gloo backend on CPU workers"));
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(options, std::make_unique<Impl>()));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Connect(
    KeyValueClient* kv, const Options& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> comm, Create(options));
  RETURN_IF_ERROR(comm->Connect(kv));
  return comm;
}

absl::Status NcclCommunicator::Connect(KeyValueClient* kv) {
  const Options& options = options_;
  if (aborted_) return absl::AbortedError("the communicator was aborted");
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

  // The communicator owns what follows from here: its destructor frees
  // whatever was made when a later step fails.
  Impl& impl = *impl_;
  error = cudaStreamCreateWithFlags(&impl.stream, cudaStreamNonBlocking);
  if (error != cudaSuccess) return CudaError(error, "cudaStreamCreate");
  error = cudaMalloc(&impl.barrier, sizeof(float));
  if (error != cudaSuccess) return CudaError(error, "cudaMalloc");
  error = cudaMemsetAsync(impl.barrier, 0, sizeof(float), impl.stream);
  if (error != cudaSuccess) return CudaError(error, "cudaMemsetAsync");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  // Non-blocking, so initialization can be abandoned at the deadline or
  // on Abort() (a peer that died before joining never completes it).
  config.blocking = 0;
  ncclResult_t result = ncclCommInitRankConfig(&impl.comm, options.size, id,
                                               options.rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    AbortComm();
    return absl::UnavailableError(
        absl::StrCat("NCCL init of rank ", options.rank, " of ", options.size,
                     ": ", ncclGetErrorString(result)));
  }
  absl::Time deadline = absl::Now() + options.timeout;
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    if (ncclCommGetAsyncError(impl.comm, &state) != ncclSuccess) {
      state = ncclInternalError;
    }
    if (state == ncclInProgress) {
      if (aborted_) {
        AbortComm();
        return absl::AbortedError(
            absl::StrCat("NCCL init of rank ", options.rank, " was aborted"));
      }
      if (absl::Now() > deadline) {
        AbortComm();
        return absl::DeadlineExceededError(absl::StrCat(
            "NCCL init of rank ", options.rank, " of ", options.size,
            " did not finish within ", absl::FormatDuration(options.timeout),
            "; a peer did not join"));
      }
      std::this_thread::yield();
    }
  }
  if (state != ncclSuccess) {
    AbortComm();
    return absl::UnavailableError(
        absl::StrCat("NCCL init of rank ", options.rank, " of ", options.size,
                     ": ", ncclGetErrorString(state)));
  }
  return CheckMembership();
}

absl::Status NcclCommunicator::CheckMembership() {
  if (options_.size == 1) return absl::OkStatus();
  ASSIGN_OR_RETURN(
      const std::string mine,
      MembershipProof(options_.membership, options_.rank, kEveryRank));
  std::string gathered(kProofSize * options_.size, '\0');
  RETURN_IF_ERROR(AllGather(mine.data(), kProofSize, gathered.data()));
  absl::Status checked = CheckGatheredProofs(options_.membership, options_.size,
                                             options_.rank, gathered);
  if (!checked.ok()) return Fail(checked);
  return absl::OkStatus();
}

NcclCommunicator::~NcclCommunicator() {
  DeviceGuard device(options_.device);
  if (impl_->comm != nullptr && !aborted_) {
    // Every collective was waited on, so nothing of NCCL's is pending: flush
    // what NCCL still sends to peers, then free. Bounded like a collective.
    const absl::Time deadline = absl::Now() + options_.timeout;
    ncclResult_t state = ncclCommFinalize(impl_->comm);
    while (state == ncclInProgress && !aborted_ && absl::Now() <= deadline) {
      std::this_thread::yield();
      if (ncclCommGetAsyncError(impl_->comm, &state) != ncclSuccess) {
        state = ncclInternalError;
      }
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(impl_->comm);
      impl_->comm = nullptr;
    }
  }
  AbortComm();  // after Abort(), a failure, or a finalize that did not end
  // NCCL's work is done or aborted; what else the stream holds (copies,
  // event waits) ends on its own. Only then are its buffers freed.
  if (impl_->stream != nullptr) cudaStreamSynchronize(impl_->stream);
  if (impl_->staging != nullptr) cudaFree(impl_->staging);
  if (impl_->barrier != nullptr) cudaFree(impl_->barrier);
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

absl::Status NcclCommunicator::Fail(absl::Status status) {
  AbortComm();
  return status;
}

absl::Status NcclCommunicator::Wait(const char* what, absl::Time deadline) {
  while (true) {
    if (aborted_ || impl_->comm == nullptr) {
      AbortComm();
      return absl::AbortedError(
          absl::StrCat(what, " on rank ", rank(), " was aborted"));
    }
    // NCCL's state first: while a non-blocking enqueue is ncclInProgress
    // the collective may not be on the stream yet, and an idle stream would
    // look like a finished collective.
    ncclResult_t state = ncclInProgress;
    ncclResult_t result = ncclCommGetAsyncError(impl_->comm, &state);
    if (result != ncclSuccess) state = result;
    if (state != ncclSuccess && state != ncclInProgress) {
      return Fail(absl::UnavailableError(absl::StrCat(
          what, " failed on rank ", rank(), " of ", size(), ": ",
          ncclGetErrorString(state), "; a peer died or was cut off")));
    }
    if (state == ncclSuccess) {  // enqueued: the stream says when it ran
      cudaError_t done = cudaStreamQuery(impl_->stream);
      if (done == cudaSuccess) return absl::OkStatus();
      if (done != cudaErrorNotReady) {
        return Fail(absl::UnavailableError(absl::StrCat(
            what, " failed on rank ", rank(), ": ", cudaGetErrorString(done))));
      }
    }
    if (absl::Now() > deadline) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(
          what, " on rank ", rank(), " of ", size(), " did not finish within ",
          absl::FormatDuration(options_.timeout), "; a peer hung or died")));
    }
    std::this_thread::yield();
  }
}

absl::StatusOr<bool> NcclCommunicator::IsHostMemory(const void* data,
                                                    const char* what) {
  cudaPointerAttributes attributes;
  cudaError_t error = cudaPointerGetAttributes(&attributes, data);
  if (error != cudaSuccess) {
    cudaGetLastError();  // memory CUDA does not know: plain host memory
    return true;
  }
  switch (attributes.type) {
    case cudaMemoryTypeDevice:
      if (attributes.device != options_.device) {
        return Fail(absl::InvalidArgumentError(absl::StrCat(
            what, " on rank ", rank(), " got memory of CUDA device ",
            attributes.device, " but the communicator is on device ",
            options_.device)));
      }
      return false;
    case cudaMemoryTypeManaged:
      return false;
    default:  // cudaMemoryTypeUnregistered (pageable) or cudaMemoryTypeHost
      return true;
  }
}

absl::Status NcclCommunicator::ReserveStaging(size_t bytes, const char* what) {
  if (impl_->staging_bytes >= bytes) return absl::OkStatus();
  // The stream holds no copy or collective here (each call waited for its
  // own), so the old buffer can go.
  const size_t grown =
      std::max({bytes, 2 * impl_->staging_bytes, kMinStagingBytes});
  if (impl_->staging != nullptr) cudaFree(impl_->staging);
  impl_->staging = nullptr;
  impl_->staging_bytes = 0;
  cudaError_t error = cudaMalloc(&impl_->staging, grown);
  if (error != cudaSuccess) {
    impl_->staging = nullptr;
    return Fail(absl::ResourceExhaustedError(absl::StrCat(
        what, " on rank ", rank(), " could not stage ", bytes,
        " bytes of host memory on the device: ", cudaGetErrorString(error))));
  }
  impl_->staging_bytes = grown;
  return absl::OkStatus();
}

absl::Status NcclCommunicator::CopyOnStream(void* to, const void* from,
                                            size_t bytes, const char* what) {
  cudaError_t error =
      cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, impl_->stream);
  if (error != cudaSuccess) {
    return Fail(absl::UnavailableError(absl::StrCat(
        what, " on rank ", rank(),
        " could not stage its buffer: ", cudaGetErrorString(error))));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::CopyOut(void* host, const void* device,
                                       size_t bytes, const char* what,
                                       absl::Time deadline) {
  // Only now: a copy into pageable memory can block the host until the
  // stream reaches it, which must not happen while a collective that waits
  // on peers is ahead of it on the stream.
  RETURN_IF_ERROR(CopyOnStream(host, device, bytes, what));
  return Wait(what, deadline);
}

absl::Status NcclCommunicator::AllReduceSum(void* data, size_t count,
                                            DataType type) {
  if (aborted_) return absl::AbortedError("the communicator was aborted");
  if (count == 0) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + options_.timeout;
  DeviceGuard device(options_.device);
  const size_t bytes = count * ElementSize(type);
  ASSIGN_OR_RETURN(bool host, IsHostMemory(data, "all-reduce"));
  void* buffer = data;
  if (host) {
    RETURN_IF_ERROR(ReserveStaging(bytes, "all-reduce"));
    buffer = impl_->staging;
    RETURN_IF_ERROR(CopyOnStream(buffer, data, bytes, "all-reduce"));
  }
  absl::Status enqueued = Enqueued(
      "ncclAllReduce", ncclAllReduce(buffer, buffer, count, NcclType(type),
                                     ncclSum, impl_->comm, impl_->stream));
  if (!enqueued.ok()) return Fail(enqueued);
  RETURN_IF_ERROR(Wait("all-reduce", deadline));
  if (host) return CopyOut(data, buffer, bytes, "all-reduce", deadline);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (aborted_) return absl::AbortedError("the communicator was aborted");
  if (bytes == 0) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + options_.timeout;
  DeviceGuard device(options_.device);
  ASSIGN_OR_RETURN(bool host, IsHostMemory(data, "broadcast"));
  void* buffer = data;
  if (host) {
    RETURN_IF_ERROR(ReserveStaging(bytes, "broadcast"));
    buffer = impl_->staging;
    if (rank() == root) {  // the others' contents are overwritten
      RETURN_IF_ERROR(CopyOnStream(buffer, data, bytes, "broadcast"));
    }
  }
  absl::Status enqueued = Enqueued(
      "ncclBroadcast", ncclBroadcast(buffer, buffer, bytes, ncclUint8, root,
                                     impl_->comm, impl_->stream));
  if (!enqueued.ok()) return Fail(enqueued);
  RETURN_IF_ERROR(Wait("broadcast", deadline));
  if (host) return CopyOut(data, buffer, bytes, "broadcast", deadline);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AllGather(const void* in, size_t bytes,
                                         void* out) {
  if (aborted_) return absl::AbortedError("the communicator was aborted");
  if (bytes == 0) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + options_.timeout;
  DeviceGuard device(options_.device);
  const size_t out_bytes = bytes * static_cast<size_t>(size());
  ASSIGN_OR_RETURN(bool host_in, IsHostMemory(in, "all-gather"));
  ASSIGN_OR_RETURN(bool host_out, IsHostMemory(out, "all-gather"));
  // Staging layout: [in, rounded up][out].
  const size_t out_offset = host_in ? RoundUp(bytes) : 0;
  if (host_in || host_out) {
    RETURN_IF_ERROR(
        ReserveStaging(out_offset + (host_out ? out_bytes : 0), "all-gather"));
  }
  char* staging = static_cast<char*>(impl_->staging);
  const void* send = host_in ? staging : in;
  void* receive = host_out ? staging + out_offset : out;
  if (host_in) {
    RETURN_IF_ERROR(CopyOnStream(staging, in, bytes, "all-gather"));
  }
  absl::Status enqueued =
      Enqueued("ncclAllGather", ncclAllGather(send, receive, bytes, ncclUint8,
                                              impl_->comm, impl_->stream));
  if (!enqueued.ok()) return Fail(enqueued);
  RETURN_IF_ERROR(Wait("all-gather", deadline));
  if (host_out) return CopyOut(out, receive, out_bytes, "all-gather", deadline);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Barrier() {
  return AllReduceSum(impl_->barrier, 1, DataType::kFloat32);
}

absl::Status NcclCommunicator::WaitForEvent(void* cuda_event) {
  if (aborted_) return absl::AbortedError("the communicator was aborted");
  if (cuda_event == nullptr) {
    return absl::InvalidArgumentError("WaitForEvent needs an event");
  }
  DeviceGuard device(options_.device);
  cudaError_t error = cudaStreamWaitEvent(
      impl_->stream, static_cast<cudaEvent_t>(cuda_event), 0);
  if (error != cudaSuccess) {
    return Fail(absl::UnavailableError(
        absl::StrCat("cudaStreamWaitEvent on rank ", rank(), ": ",
                     cudaGetErrorString(error))));
  }
  return absl::OkStatus();
}

}  // namespace lockstep::worker
