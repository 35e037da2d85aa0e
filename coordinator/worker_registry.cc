// The coordinator's worker registry: registration, sessions, silence and
// straggler detection, and picking the workers of a generation.
#include "coordinator/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/tf_config.h"
#include "coordinator/session_sink.h"

namespace lockstep::coordinator {

absl::StatusOr<std::string> RegistrationId(
    const std::optional<v1::ClusterSpec>& cluster,
    const v1::RegisterWorkerRequest& request) {
  if (!cluster.has_value()) {
    return request.task().type().empty() ? "" : TaskName(request.task());
  }
  if (request.task().type().empty() && request.spare()) {
    return "";  // a spare by flag: free registration beside the cluster
  }
  if (request.task().type().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker on ", request.host(),
        " registered without a task identity, but this coordinator runs "
        "the static cluster ",
        DescribeCluster(*cluster),
        "; give the worker TF_CONFIG or --task-type/--task-index, or "
        "--spare to stand by as a hot spare"));
  }
  auto rank = RankOf(*cluster, request.task());
  if (!rank.ok() && !IsSpareTask(*cluster, request.task())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refusing worker on ", request.host(), ": ", rank.status().message()));
  }
  if (!request.cluster().tasks().empty() &&
      !SameCluster(request.cluster(), *cluster)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task ", TaskName(request.task()), " on ", request.host(),
        " has TF_CONFIG cluster ", DescribeCluster(request.cluster()),
        " but the coordinator's cluster is ", DescribeCluster(*cluster),
        "; give every task and the coordinator the same cluster"));
  }
  return TaskName(request.task());
}

WorkerRegistry::WorkerRegistry(std::optional<v1::ClusterSpec> cluster,
                               absl::Duration heartbeat_timeout,
                               absl::Duration stall_after)
    : cluster_(std::move(cluster)),
      heartbeat_timeout_(heartbeat_timeout),
      stall_after_(stall_after) {}

std::string WorkerRegistry::FreeId(uint64_t incarnation,
                                   const std::string& identity) const {
  std::string id;
  for (const auto& [existing_id, worker] : workers_) {
    if (worker.incarnation == incarnation && worker.identity == identity &&
        worker.task.type().empty()) {
      id = existing_id;
    }
  }
  return id.empty() ? absl::StrCat("free:", next_order_) : id;
}

Worker* WorkerRegistry::Find(const std::string& id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

const Worker* WorkerRegistry::Find(const std::string& id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

Worker& WorkerRegistry::Add(const std::string& id) {
  Worker& worker = workers_[id];
  worker.id = id;
  worker.order = next_order_++;
  return worker;
}

bool WorkerRegistry::Restore(const std::string& id, const std::string& identity,
                             uint64_t incarnation, int64_t order,
                             absl::Time now) {
  int64_t number = 0;
  if (!absl::StartsWith(id, "free:") ||
      !absl::SimpleAtoi(absl::StripPrefix(id, "free:"), &number) ||
      number < 0 || order < 0 || identity.empty() || identity.size() > 2048) {
    return false;
  }
  Worker& worker = workers_[id];
  worker.id = id;
  worker.identity = identity;
  worker.incarnation = incarnation;
  worker.order = order;
  worker.last_heartbeat = now;
  // New ids (free:<next_order_>) must not meet a restored one.
  next_order_ = std::max({next_order_, number + 1, order + 1});
  return true;
}

void WorkerRegistry::Register(Worker& worker,
                              const v1::RegisterWorkerRequest& request,
                              absl::Time now) {
  worker.task = request.task();
  worker.host = request.host();
  worker.device = request.device();
  worker.spare = request.spare() || request.task().type() == "spare";
  worker.labels.clear();
  worker.labels.insert(request.labels().begin(), request.labels().end());
  // A new process has loaded nothing yet.
  if (request.incarnation() != worker.incarnation) worker.standby_job.clear();
  // A worker that says nothing of its device trains on the CPU.
  if (worker.device.name().empty()) worker.device.set_name("cpu");
  worker.incarnation = request.incarnation();
  worker.last_heartbeat = now;
}

void WorkerRegistry::Assign(Worker& worker, const std::string& job_id,
                            int64_t generation, int rank, absl::Time now) {
  worker.job_id = job_id;
  worker.holds_rank = true;
  // A rank loads the job's data: once its part ends it stands by already.
  worker.standby_job = job_id;
  worker.rank = rank;
  worker.generation = generation;
  worker.collective_seq = 0;
  worker.seq_changed = now;
  worker.seq_reported = absl::InfinitePast();
  worker.link_mbps.clear();  // the last generation's peers were others
  worker.assigned_at = now;
}

void WorkerRegistry::Unassign(Worker& worker) { worker.holds_rank = false; }

void WorkerRegistry::Heartbeat(Worker& worker, const v1::Heartbeat& beat,
                               absl::Time now) {
  if (!worker.holds_rank || beat.job_id() != worker.job_id ||
      beat.generation() != worker.generation) {
    return;
  }
  if (beat.collective_seq() != worker.collective_seq) {
    worker.collective_seq = beat.collective_seq();
    worker.seq_changed = now;
  }
  worker.seq_reported = now;
  worker.link_mbps.assign(beat.link_mbps().begin(), beat.link_mbps().end());
}

std::vector<Worker*> WorkerRegistry::Silent(absl::Time now) {
  std::vector<Worker*> silent;
  for (auto& [id, worker] : workers_) {
    if (worker.sink != nullptr &&
        now - worker.last_heartbeat > heartbeat_timeout_) {
      silent.push_back(&worker);
    }
  }
  return silent;
}

std::vector<Worker*> WorkerRegistry::Connected() {
  std::vector<Worker*> connected;
  for (auto& [id, worker] : workers_) {
    if (worker.sink != nullptr) connected.push_back(&worker);
  }
  return connected;
}

std::vector<Worker*> WorkerRegistry::NotJoined(
    const std::string& job_id, const std::vector<std::string>& rank_workers,
    absl::Time now) {
  std::vector<Worker*> late;
  for (Worker* worker : RanksOf(job_id, rank_workers)) {
    if (worker->sink != nullptr &&
        worker->seq_reported == absl::InfinitePast() &&
        now - worker->assigned_at > heartbeat_timeout_) {
      late.push_back(worker);
    }
  }
  return late;
}

bool WorkerRegistry::Available(const Worker& worker) {
  return worker.sink != nullptr && !worker.holds_rank && !worker.leaving;
}

std::vector<Worker*> WorkerRegistry::Pick(
    const v1::JobSpec& spec, const std::vector<std::string>& previous,
    const std::set<std::string>& reserved) {
  if (!cluster_.has_value()) return PickFree(spec, previous, reserved);
  return previous.empty() ? PickStatic(reserved)
                          : RefillStatic(previous, reserved);
}

std::vector<Worker*> WorkerRegistry::PickStatic(
    const std::set<std::string>& reserved) {
  std::vector<Worker*> picked;
  for (const v1::TaskId& task : TrainingTasks(*cluster_)) {
    Worker* worker = Find(TaskName(task));
    if (worker == nullptr || !Available(*worker) ||
        reserved.count(worker->id) > 0) {
      return {};
    }
    picked.push_back(worker);
  }
  return picked;
}

std::vector<Worker*> WorkerRegistry::Replacements(
    const std::vector<Worker*>& taken, const std::set<std::string>& reserved) {
  std::vector<Worker*> candidates;
  for (auto& [id, worker] : workers_) {
    if (Available(worker) && reserved.count(id) == 0 &&
        std::find(taken.begin(), taken.end(), &worker) == taken.end()) {
      candidates.push_back(&worker);
    }
  }
  // Workers that are not spares first (a static task back from a failure
  // comes first anyway: it registered after everyone it is ranked with),
  // then spares, each by registration.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Worker* a, const Worker* b) {
                     return std::pair(a->spare, a->order) <
                            std::pair(b->spare, b->order);
                   });
  return candidates;
}

std::vector<Worker*> WorkerRegistry::RefillStatic(
    const std::vector<std::string>& previous,
    const std::set<std::string>& reserved) {
  const std::vector<v1::TaskId> tasks = TrainingTasks(*cluster_);
  std::vector<Worker*> slots(tasks.size(), nullptr);
  // Each rank stays with the process that held it; a rank whose holder is
  // gone goes back to its own task if that is here again.
  for (size_t rank = 0; rank < tasks.size(); ++rank) {
    for (const std::string& id : {rank < previous.size() ? previous[rank] : "",
                                  TaskName(tasks[rank])}) {
      Worker* worker = id.empty() ? nullptr : Find(id);
      if (slots[rank] == nullptr && worker != nullptr && Available(*worker) &&
          reserved.count(worker->id) == 0 &&
          std::find(slots.begin(), slots.end(), worker) == slots.end()) {
        slots[rank] = worker;
      }
    }
  }
  // The rest go to whoever stands by: a spare, or a task whose own rank
  // another process took.
  std::vector<Worker*> spares = Replacements(slots, reserved);
  auto next = spares.begin();
  for (Worker*& slot : slots) {
    if (slot != nullptr) continue;
    if (next == spares.end()) return {};
    slot = *next++;
  }
  return slots;
}

std::vector<Worker*> WorkerRegistry::PickFree(
    const v1::JobSpec& spec, const std::vector<std::string>& previous,
    const std::set<std::string>& reserved) {
  const bool elastic = spec.min_workers() > 0;
  const int wanted = spec.num_workers();
  const size_t most =
      elastic ? (spec.max_workers() > 0 ? spec.max_workers() : workers_.size())
      : wanted > 0 ? wanted
                   : workers_.size();
  // The previous generation's ranks keep their rank numbers: they hold the
  // job's state. A rank whose holder is gone goes to a worker standing by
  // (workers that are not spares first).
  std::vector<Worker*> slots;
  for (const std::string& id : previous) {
    Worker* worker = Find(id);
    slots.push_back(worker != nullptr && Available(*worker) &&
                            reserved.count(id) == 0
                        ? worker
                        : nullptr);
  }
  std::vector<Worker*> others = Replacements(slots, reserved);
  auto next = others.begin();
  for (Worker*& slot : slots) {
    if (slot == nullptr && next != others.end()) slot = *next++;
  }
  // An elastic job shrinks when nobody can fill a hole: the survivors move
  // up, keeping their order.
  slots.erase(std::remove(slots.begin(), slots.end(), nullptr), slots.end());
  // Then it grows with workers that are not spares: a spare is held back
  // for failures while the job can run at its size.
  for (; next != others.end() && slots.size() < most; ++next) {
    if ((*next)->spare) break;
    slots.push_back(*next);
  }
  if (slots.size() > most) slots.resize(most);
  const size_t least = elastic ? spec.min_workers() : wanted > 0 ? wanted : 1;
  if (slots.size() < least) return {};
  return slots;
}

std::vector<Worker*> WorkerRegistry::StandingBy() {
  std::vector<Worker*> idle;
  for (auto& [id, worker] : workers_) {
    if (Available(worker)) idle.push_back(&worker);
  }
  return idle;
}

std::vector<Worker*> WorkerRegistry::RanksOf(
    const std::string& job_id, const std::vector<std::string>& rank_workers) {
  std::vector<Worker*> ranks;
  for (const std::string& id : rank_workers) {
    Worker* worker = Find(id);
    if (worker != nullptr && worker->holds_rank && worker->job_id == job_id) {
      ranks.push_back(worker);
    }
  }
  return ranks;
}

std::string WorkerRegistry::Stall(const std::string& job_id,
                                  const std::vector<std::string>& rank_workers,
                                  absl::Time now) const {
  std::vector<const Worker*> ranks;
  int64_t ahead = 0;
  for (const std::string& id : rank_workers) {
    const Worker* worker = Find(id);
    if (worker == nullptr || !worker->holds_rank || worker->job_id != job_id) {
      continue;
    }
    ranks.push_back(worker);
    ahead = std::max(ahead, worker->collective_seq);
  }
  for (const Worker* worker : ranks) {
    absl::Duration behind = now - worker->seq_changed;
    // Stalled only on the rank's own word: a heartbeat that still reports
    // the count it had stall_after_ earlier. Between heartbeats a rank that
    // has moved on just has not said so yet.
    if (worker->collective_seq < ahead &&
        worker->seq_reported - worker->seq_changed >= stall_after_) {
      return absl::StrFormat(
          "rank %d (%s on %s) stalled at collective #%d for %.0f s",
          worker->rank, worker->id, worker->host, worker->collective_seq + 1,
          absl::ToDoubleSeconds(behind));
    }
  }
  return SlowLink(ranks);
}

std::string WorkerRegistry::SlowLink(const std::vector<const Worker*>& ranks) {
  if (ranks.size() < 3) return "";  // two ranks: either end could be slow
  // For each rank, the median rate at which its data reaches its peers.
  std::vector<std::pair<double, const Worker*>> medians;
  for (const Worker* to : ranks) {
    std::vector<double> seen;
    for (const Worker* from : ranks) {
      if (from == to || to->rank < 0 ||
          to->rank >= static_cast<int>(from->link_mbps.size())) {
        continue;
      }
      if (double rate = from->link_mbps[to->rank]; rate > 0) {
        seen.push_back(rate);
      }
    }
    if (seen.size() + 1 < ranks.size()) return "";  // not measured by all
    std::sort(seen.begin(), seen.end());
    medians.emplace_back(seen[seen.size() / 2], to);
  }
  std::sort(medians.begin(), medians.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  const double slowest = medians.front().first;
  const double typical = medians[medians.size() / 2].first;
  if (slowest * 3 > typical) return "";
  const Worker& worker = *medians.front().second;
  return absl::StrFormat(
      "rank %d (%s on %s) has the slowest data-plane link: its data reaches "
      "its peers at %.0f MB/s, the others' at %.0f MB/s",
      worker.rank, worker.id, worker.host, slowest, typical);
}

std::vector<std::string> WorkerRegistry::ForgetVanished(absl::Time now,
                                                        absl::Duration after) {
  std::vector<std::string> forgotten;
  for (auto it = workers_.begin(); it != workers_.end();) {
    const Worker& worker = it->second;
    if (worker.task.type().empty() && worker.sink == nullptr &&
        !worker.holds_rank && now - worker.last_heartbeat > after) {
      forgotten.push_back(it->first);
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  return forgotten;
}

std::vector<v1::WorkerInfo> WorkerRegistry::List(const std::string& after,
                                                 size_t limit,
                                                 bool* more) const {
  std::vector<v1::WorkerInfo> infos;
  if (more != nullptr) *more = false;
  for (auto it = after.empty() ? workers_.begin() : workers_.upper_bound(after);
       it != workers_.end(); ++it) {
    if (infos.size() == limit) {
      if (more != nullptr) *more = true;
      break;
    }
    const auto& [id, worker] = *it;
    v1::WorkerInfo& info = infos.emplace_back();
    info.set_worker_id(id);
    info.set_host(worker.host);
    *info.mutable_device() = worker.device;
    info.set_connected(worker.sink != nullptr);
    info.set_job_id(worker.holds_rank ? worker.job_id : "");
    info.set_rank(worker.holds_rank ? worker.rank : -1);
    info.set_generation(worker.generation);
    info.set_collective_seq(worker.collective_seq);
    info.set_last_heartbeat(
        absl::ToDoubleSeconds(worker.last_heartbeat - absl::UnixEpoch()));
    info.set_spare(worker.spare);
    info.mutable_labels()->insert(worker.labels.begin(), worker.labels.end());
    if (!worker.holds_rank) info.set_standby_job_id(worker.standby_job);
    info.set_state(worker.sink == nullptr        ? "disconnected"
                   : worker.holds_rank           ? "training"
                   : !worker.standby_job.empty() ? "standby"
                                                 : "idle");
  }
  return infos;
}

void WorkerRegistry::CloseAll() {
  for (auto& [id, worker] : workers_) {
    if (worker.sink != nullptr) worker.sink->Close();
  }
}

std::string WorkerRegistry::Describe(const Worker& worker) {
  std::string text = absl::StrCat(worker.id, " (host ", worker.host);
  if (worker.holds_rank) absl::StrAppend(&text, ", rank ", worker.rank);
  return absl::StrCat(text, ")");
}

}  // namespace lockstep::coordinator
