#include "worker/collective/gloo_communicator.h"

#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <exception>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "worker/collective/kv_store.h"

namespace lockstep::worker {
namespace {

using gloo::transport::UnboundBuffer;

// Thrown inside a collective when Abort() released one of its waits.
struct AbortedWait : std::runtime_error {
  AbortedWait() : std::runtime_error("aborted") {}
};

// Chunk `i` of `count` elements split `parts` ways: [begin, end).
std::pair<size_t, size_t> Chunk(size_t count, int parts, int i) {
  size_t base = count / parts, extra = count % parts;
  size_t begin = i * base + std::min<size_t>(i, extra);
  return {begin, begin + base + (static_cast<size_t>(i) < extra ? 1 : 0)};
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
    // A rank's connectFullMesh can return before its peers' have; closing
    // early (a short task, an abort) would break theirs. Leave together.
    gloo::BarrierOptions barrier(context);
    barrier.setTimeout(absl::ToChronoMilliseconds(options.timeout));
    gloo::barrier(barrier);
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
  absl::MutexLock lock(&mu_);
  aborted_ = true;
  for (UnboundBuffer* buffer : active_) {
    buffer->abortWaitSend();
    buffer->abortWaitRecv();
  }
}

absl::Status GlooCommunicator::Guarded(
    absl::string_view what, const std::vector<UnboundBuffer*>& buffers,
    const std::function<void()>& body) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return absl::AbortedError("the communicator was aborted");
    active_ = buffers;
  }
  absl::Status status;
  try {
    body();
  } catch (const AbortedWait&) {
    status = absl::AbortedError(
        absl::StrCat(what, " on rank ", rank(), " was aborted"));
  } catch (const std::exception& e) {
    status = absl::UnavailableError(
        absl::StrCat(what, " failed on rank ", rank(), " of ", size(), ": ",
                     e.what(), "; a peer died or timed out"));
  }
  absl::MutexLock lock(&mu_);
  active_.clear();
  if (!status.ok() && aborted_) {
    return absl::AbortedError(
        absl::StrCat(what, " on rank ", rank(), " was aborted"));
  }
  return status;
}

void GlooCommunicator::WaitSend(UnboundBuffer& buffer) {
  if (!buffer.waitSend(absl::ToChronoMilliseconds(options_.timeout))) {
    throw AbortedWait();
  }
}

void GlooCommunicator::WaitRecv(UnboundBuffer& buffer) {
  if (!buffer.waitRecv(absl::ToChronoMilliseconds(options_.timeout))) {
    throw AbortedWait();
  }
}

// Ring all-reduce: W-1 reduce-scatter steps, each sending one chunk to the
// right neighbour and adding the chunk received from the left, then W-1
// all-gather steps passing the reduced chunks around. Every rank adds the
// same values in the same order for a given world size, so the result is
// bitwise identical on all ranks and from run to run.
absl::Status GlooCommunicator::AllReduceSum(float* data, size_t count) {
  const int world = size();
  if (count == 0 || world == 1) {
    absl::MutexLock lock(&mu_);
    return aborted_ ? absl::AbortedError("the communicator was aborted")
                    : absl::OkStatus();
  }
  const int me = rank();
  const int right = (me + 1) % world;
  const int left = (me + world - 1) % world;
  size_t largest = Chunk(count, world, 0).second;
  std::vector<float> scratch(largest);
  auto out = context_->createUnboundBuffer(data, count * sizeof(float));
  auto in =
      context_->createUnboundBuffer(scratch.data(), largest * sizeof(float));
  const uint64_t slot = NextSlot();
  return Guarded("all-reduce", {out.get(), in.get()}, [&] {
    for (int step = 0; step < world - 1; ++step) {
      auto [send_begin, send_end] =
          Chunk(count, world, (me - step + world) % world);
      auto [recv_begin, recv_end] =
          Chunk(count, world, (me - step - 1 + 2 * world) % world);
      out->send(right, slot + step, send_begin * sizeof(float),
                (send_end - send_begin) * sizeof(float));
      in->recv(left, slot + step, 0, (recv_end - recv_begin) * sizeof(float));
      WaitRecv(*in);
      for (size_t i = recv_begin; i < recv_end; ++i) {
        data[i] += scratch[i - recv_begin];
      }
      WaitSend(*out);
    }
    for (int step = 0; step < world - 1; ++step) {
      auto [send_begin, send_end] =
          Chunk(count, world, (me + 1 - step + world) % world);
      auto [recv_begin, recv_end] =
          Chunk(count, world, (me - step + world) % world);
      uint64_t s = slot + world + step;
      out->send(right, s, send_begin * sizeof(float),
                (send_end - send_begin) * sizeof(float));
      out->recv(left, s, recv_begin * sizeof(float),
                (recv_end - recv_begin) * sizeof(float));
      WaitRecv(*out);
      WaitSend(*out);
    }
  });
}

absl::Status GlooCommunicator::Broadcast(float* data, size_t count, int root) {
  const int world = size();
  if (count == 0 || world == 1) {
    absl::MutexLock lock(&mu_);
    return aborted_ ? absl::AbortedError("the communicator was aborted")
                    : absl::OkStatus();
  }
  auto buffer = context_->createUnboundBuffer(data, count * sizeof(float));
  const uint64_t slot = NextSlot();
  return Guarded("broadcast", {buffer.get()}, [&] {
    if (rank() == root) {
      for (int peer = 0; peer < world; ++peer) {
        if (peer != root) buffer->send(peer, slot, 0, count * sizeof(float));
      }
      for (int peer = 1; peer < world; ++peer) WaitSend(*buffer);
    } else {
      buffer->recv(root, slot, 0, count * sizeof(float));
      WaitRecv(*buffer);
    }
  });
}

}  // namespace lockstep::worker
