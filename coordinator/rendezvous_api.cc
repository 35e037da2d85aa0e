// The Coordinator's rendezvous entry points: the key-value store of a job's
// live generation, the fence that refuses every other generation, who may
// call them, and the job watchers. The pending calls are the Rendezvous's
// (rendezvous.h).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/coordinator.h"
#include "coordinator/message_checks.h"

namespace lockstep::coordinator {
absl::StatusOr<Generation*> Coordinator::CurrentGenerationLocked(
    const std::string& job_id, int64_t number) {
  if (shutdown_) return absl::CancelledError("the coordinator is stopping");
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job ", job_id));
  }
  Generation* current = it->second.generation.get();
  if (active_jobs_.count(it->second.seq) == 0 || current == nullptr ||
      !current->Admits(number)) {
    const v1::JobStatus& status = it->second.status;
    return absl::AbortedError(absl::StrCat(
        "job ", job_id, " generation ", number, " is over (the job is ",
        v1::JobState_Name(status.state()), " in generation ",
        status.generation(), "): ", status.error()));
  }
  return current;
}

absl::Status Coordinator::AuthorizeRankLocked(const Caller& caller, Call call,
                                              const std::string& job_id,
                                              int64_t number, int rank,
                                              absl::string_view token) {
  if (caller.role == Role::kInsecure) return absl::OkStatus();
  // A generation that is over refuses everyone alike (a late rank must see
  // Aborted, and retry the generation), and serves nothing.
  ASSIGN_OR_RETURN(Generation * generation,
                   CurrentGenerationLocked(job_id, number));
  std::optional<int> held;
  for (int candidate : generation->RanksOf(caller.id)) {
    const Worker* worker = workers_.Find(generation->rank_workers()[candidate]);
    // Its registrant's worker, whose live session still holds the rank.
    if (worker == nullptr || worker->sink == nullptr ||
        worker->identity != caller.id || !worker->holds_rank ||
        worker->job_id != job_id || worker->generation != number ||
        worker->rank != candidate) {
      continue;
    }
    held = candidate;
    if (rank != candidate) continue;
    // The identity may be shared with workers of other jobs (one
    // certificate in every pod): only the rank's own assignment carried its
    // token (issue 52 §3).
    if (generation->TokenMatches(rank, token)) return absl::OkStatus();
    return Denied(
        caller, call,
        absl::StrCat("the call names rank ", rank, " of job ", job_id,
                     " generation ", number,
                     " without that rank's token; a rank proves itself with "
                     "the rank_token of its assignment (a worker sharing the "
                     "rank's certificate is not the rank)"));
  }
  const std::string which =
      absl::StrCat("job ", job_id, " generation ", number);
  if (held.has_value()) {
    return Denied(
        caller, call,
        absl::StrCat("it holds rank ", *held, " of ", which, ", not rank ",
                     rank, "; a rank calls the rendezvous only as itself"));
  }
  return Denied(caller, call,
                absl::StrCat("it holds no rank of ", which,
                             "; a generation's store serves only "
                             "its ranks, through their live sessions"));
}

absl::Status Coordinator::KvSet(const Caller& caller,
                                const v1::KvSetRequest& request) {
  RETURN_IF_ERROR(AuthorizeRole(caller, Call::kKvSet));
  if (absl::Status bad = CheckKvSet(request); !bad.ok()) return Refused(bad);
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(AuthorizeRankLocked(caller, Call::kKvSet, request.job_id(),
                                      request.generation(), request.rank(),
                                      request.rank_token()));
  ASSIGN_OR_RETURN(
      Generation * generation,
      CurrentGenerationLocked(request.job_id(), request.generation()));
  // A key that is a rank's number, or ends in "/<rank>", is that rank's
  // (its data-plane address), every other key rank 0's; only the owner's
  // session holds its token.
  int owner = 0;
  const std::string& key = request.key();
  const std::string last = key.substr(key.rfind('/') + 1);
  if (int number = 0; absl::SimpleAtoi(last, &number) && number >= 0 &&
                      number < generation->world_size() &&
                      last == absl::StrCat(number)) {
    owner = number;
  }
  if (request.rank() != owner ||
      !generation->TokenMatches(owner, request.rank_token())) {
    return Denied(
        caller, Call::kKvSet,
        absl::StrCat("key '", absl::CHexEscape(request.key().substr(0, 64)),
                     "' of job ", request.job_id(), " generation ",
                     request.generation(), " belongs to rank ", owner,
                     ", and the call ",
                     request.rank() != owner
                         ? absl::StrCat("names rank ", request.rank())
                         : std::string("does not carry that rank's token"),
                     "; a rank sets only its own keys, with the token of its "
                     "assignment"));
  }
  if (absl::Status full = generation->Set(request.key(), request.value());
      !full.ok()) {
    return Refused(full);
  }
  rendezvous_.KeySet(request.job_id(), request.generation(), request.key());
  return absl::OkStatus();
}

// ---- the non-blocking form -------------------------------------------------

Coordinator::WaitId Coordinator::KvGetAsync(const Caller& caller,
                                            const v1::KvGetRequest& request,
                                            KvGetDone done) {
  if (absl::Status refused = AuthorizeRole(caller, Call::kKvGet);
      !refused.ok()) {
    done(refused);
    return 0;
  }
  if (absl::Status bad = CheckKvGet(request); !bad.ok()) {
    done(Refused(bad));
    return 0;
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status refused = AuthorizeRankLocked(
          caller, Call::kKvGet, request.job_id(), request.generation(),
          request.rank(), request.rank_token());
      !refused.ok()) {
    done(refused);
    return 0;
  }
  return rendezvous_.KvGet(request.job_id(), request.generation(),
                           request.key(), request.timeout_ms(),
                           std::move(done));
}

void Coordinator::CancelWait(WaitId id) {
  absl::MutexLock lock(&mu_);
  rendezvous_.Cancel(id);
}

// ---- job watchers ----------------------------------------------------------

absl::StatusOr<Coordinator::WaitId> Coordinator::WatchJob(
    const std::string& job_id, JobWatcher watcher) {
  if (absl::Status bad = CheckJobId("WatchJob", job_id); !bad.ok()) {
    return Refused(bad);
  }
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the coordinator is stopping");
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no job ", job_id, "; `lockstep status` lists jobs"));
  }
  watcher(std::make_shared<const v1::JobStatus>(
      ReportLocked(it->second, /*include_history=*/false)));
  WaitId id = next_wait_id_++;
  watches_.emplace(id, Watch{job_id, std::move(watcher)});
  return id;
}

void Coordinator::Unwatch(WaitId id) {
  absl::MutexLock lock(&mu_);
  watches_.erase(id);
}

void Coordinator::NotifyWatchersLocked(const Job& job) {
  std::shared_ptr<const v1::JobStatus> report;
  for (auto& [id, watch] : watches_) {
    if (watch.job_id != job.status.job_id()) continue;
    if (report == nullptr) {
      report = std::make_shared<const v1::JobStatus>(
          ReportLocked(job, /*include_history=*/false));
    }
    watch.watcher(report);
  }
}

}  // namespace lockstep::coordinator
