#include "worker/collective/gloo_communicator.h"

#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <exception>

#include "absl/strings/str_cat.h"
#include "worker/collective/kv_store.h"

namespace lockstep::worker {
namespace {

absl::Status CollectiveError(const Communicator& comm, absl::string_view what,
                             const std::exception& e) {
  return absl::UnavailableError(
      absl::StrCat(what, " failed on rank ", comm.rank(), " of ", comm.size(),
                   ": ", e.what(), "; a peer died, was aborted or timed out"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    KeyValueClient* kv, const Options& options) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context =
        std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(absl::ToChronoMilliseconds(options.timeout));
    KvStore store(kv, options.timeout);
    context->connectFullMesh(store, device);
    return std::unique_ptr<GlooCommunicator>(
        new GlooCommunicator(options, std::move(context)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "Gloo rendezvous of rank ", options.rank, " of ", options.size, " on ",
        options.host, " failed: ", e.what()));
  }
}

GlooCommunicator::~GlooCommunicator() = default;

void GlooCommunicator::Abort() {
  if (aborted_.exchange(true)) return;
  try {
    context_->closeConnections();
  } catch (const std::exception&) {
    // Already broken: the pending call fails on its own.
  }
}

absl::Status GlooCommunicator::AllReduceSum(float* data, size_t count) {
  if (aborted_) return absl::AbortedError("the communicator was aborted");
  if (count == 0 || size() == 1) return absl::OkStatus();
  try {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, count);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<float>));
    opts.setTag(next_tag_++);
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    if (aborted_) return absl::AbortedError("the communicator was aborted");
    return CollectiveError(*this, "all-reduce", e);
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Broadcast(float* data, size_t count, int root) {
  if (aborted_) return absl::AbortedError("the communicator was aborted");
  if (count == 0 || size() == 1) return absl::OkStatus();
  try {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data, count);
    opts.setRoot(root);
    opts.setTag(next_tag_++);
    gloo::broadcast(opts);
  } catch (const std::exception& e) {
    if (aborted_) return absl::AbortedError("the communicator was aborted");
    return CollectiveError(*this, "broadcast", e);
  }
  return absl::OkStatus();
}

}  // namespace lockstep::worker
