// The pending rendezvous calls and when each is answered (rendezvous.h).
#include "coordinator/rendezvous.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace lockstep::coordinator {

Rendezvous::WaitId Rendezvous::KvGet(const std::string& job_id,
                                     int64_t generation, const std::string& key,
                                     int64_t timeout_ms, KvGetDone done) {
  if (auto ready = Ready(job_id, generation, key)) {
    done(*std::move(ready));
    return 0;
  }
  RendezvousWaits::Wait wait;
  wait.job_id = job_id;
  wait.generation = generation;
  wait.name = key;
  wait.timeout_ms = timeout_ms;
  wait.deadline =
      clock_->Now() + absl::Milliseconds(std::max<int64_t>(0, timeout_ms));
  wait.kv_done = std::move(done);
  const WaitId id = waits_.Add(std::move(wait));
  // A deadline already reached (timeout_ms 0) answers now, as the blocking
  // form does, instead of at the next Sweep.
  Answer(id, std::nullopt);
  return waits_.Find(id) == nullptr ? 0 : id;
}

void Rendezvous::Cancel(WaitId id) {
  Answer(id, absl::CancelledError("the caller cancelled its rendezvous call"));
}

void Rendezvous::KeySet(const std::string& job_id, int64_t generation,
                        const std::string& key) {
  for (WaitId id : waits_.On(job_id, generation, key)) {
    Answer(id, std::nullopt);
  }
}

void Rendezvous::FenceMoved(const std::string& job_id) {
  for (WaitId id : waits_.OfJob(job_id)) Answer(id, std::nullopt);
}

void Rendezvous::AnswerDue() {
  for (WaitId id : waits_.All()) Answer(id, std::nullopt);
}

std::optional<absl::StatusOr<std::string>> Rendezvous::Ready(
    const std::string& job_id, int64_t generation, const std::string& key) {
  absl::StatusOr<Generation*> live = fence_(job_id, generation);
  if (!live.ok()) return live.status();
  if (const std::string* value = (*live)->Get(key)) return *value;
  return std::nullopt;
}

void Rendezvous::Answer(WaitId id, std::optional<absl::Status> forced) {
  RendezvousWaits::Wait* wait = waits_.Find(id);
  if (wait == nullptr) return;
  // What the call returns, if it is over: `status`, or `value`.
  std::optional<absl::Status> status = forced;
  std::string value;
  if (status.has_value()) {
  } else if (auto ready = Ready(wait->job_id, wait->generation, wait->name)) {
    status = ready->status();
    if (ready->ok()) value = *std::move(*ready);
  } else if (clock_->Now() >= wait->deadline) {
    status = absl::DeadlineExceededError(
        absl::StrCat("key '", wait->name, "' of job ", wait->job_id,
                     " generation ", wait->generation, " was not set within ",
                     wait->timeout_ms, " ms; a peer did not reach rendezvous"));
  }
  if (!status.has_value()) return;  // still waiting
  RendezvousWaits::Wait done = waits_.Take(id);
  if (status->ok()) {
    done.kv_done(std::move(value));
  } else {
    done.kv_done(*status);
  }
}

}  // namespace lockstep::coordinator
