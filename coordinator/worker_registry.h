// The coordinator's worker registry: who registered (task identity or free
// registration, incarnation, host), whose session is open, who went silent,
// which workers a job's next generation gets, and which rank lags the others
// (straggler detection from the collective counts that heartbeats carry).
//
// It decides nothing about jobs: the Coordinator asks it questions and acts
// on the answers (a silent worker fails the generation it is part of).
//
// Thread-compatible: the Coordinator calls it with its lock held.
#ifndef LOCKSTEP_COORDINATOR_WORKER_REGISTRY_H_
#define LOCKSTEP_COORDINATOR_WORKER_REGISTRY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lockstep/v1/cluster.pb.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::coordinator {

class SessionSink;

// One registered worker process, and the rank it holds, if any.
struct Worker {
  std::string id;
  v1::TaskId task;  // type empty in free registration
  // Random per process; known only to the process and the coordinator (it
  // is shown to nobody: a session hello must name it).
  uint64_t incarnation = 0;
  // The identity that registered the process (Caller::id): only it may hold
  // the worker's session and, through it, the worker's ranks.
  std::string identity;
  // The address of the registration, then of the session (for the log of
  // a refused registration).
  std::string peer;
  std::string host;
  // The device the process trains on, as it registered ("cpu", "cuda:0").
  v1::Device device;
  int64_t order = 0;  // registration order, ranks free workers
  SessionSink* sink = nullptr;
  absl::Time last_heartbeat;
  // The rank it was last given (job, generation, rank), kept after its
  // part ended: a late result or a leaving worker's report of its live
  // state is accepted only for that. `holds_rank`: it still holds it (its
  // part of that generation has not ended); only then is it busy.
  std::string job_id;
  int64_t generation = 0;
  int rank = -1;
  bool holds_rank = false;
  // Collectives entered in the current generation, when that last changed,
  // and when a heartbeat last reported it: a rank whose count stays below
  // the others' is a straggler. The count is only seen every heartbeat
  // interval, so only the rank's own heartbeats can show that it did not
  // move.
  int64_t collective_seq = 0;
  absl::Time seq_changed;
  absl::Time seq_reported = absl::InfinitePast();
  // The data-plane throughput it last reported with each peer of its
  // generation (MB/s by peer rank; 0: not measured).
  std::vector<double> link_mbps;
  // When it was given its rank; until a heartbeat names the generation
  // (seq_reported), it has not joined it.
  absl::Time assigned_at;
  // Asked to be preempted (SIGTERM): not picked for a generation until it
  // registers again as a new process.
  bool leaving = false;
  // Registered as a hot spare: picked only to fill the rank of a failed
  // worker (docs/DESIGN.md §3).
  bool spare = false;
  // The job this process was told to stand by for (it loaded its data).
  std::string standby_job;
  // What it announced for placement (--label), checked at registration.
  std::map<std::string, std::string> labels;
};

// The id a registering worker gets: its task name ("worker:1") when it
// names a task, "" for free registration (the registry picks one). Reads
// only `cluster`, so it needs no lock. Errors: InvalidArgument when the task
// is not a training task of the static cluster, the worker's own cluster
// view differs from ours, or a static cluster worker gave no task identity.
absl::StatusOr<std::string> RegistrationId(
    const std::optional<v1::ClusterSpec>& cluster,
    const v1::RegisterWorkerRequest& request);

class WorkerRegistry {
 public:
  // `cluster`: the static cluster, or nullopt for free registration.
  WorkerRegistry(std::optional<v1::ClusterSpec> cluster,
                 absl::Duration heartbeat_timeout, absl::Duration stall_after);

  // Free registration: the id the free worker of `incarnation` registered
  // by `identity` already has (the same process keeps its id), or a new one.
  std::string FreeId(uint64_t incarnation, const std::string& identity) const;
  Worker* Find(const std::string& id);
  const Worker* Find(const std::string& id) const;
  // Adds worker `id` with the next registration order. It must be new.
  Worker& Add(const std::string& id);
  // A free worker a previous coordinator named (JobStore::LoadWorkers):
  // known, without a session, until its process registers again with the
  // same identity and incarnation and gets `id` back. Ids and orders after
  // it are new. Heard from `now`, so it is forgotten forget_workers_after
  // from there if it never comes back. Returns false, and keeps nothing,
  // for a record that is not a free worker's (an id other than free:N, a
  // negative order, an empty or oversized identity).
  bool Restore(const std::string& id, const std::string& identity,
               uint64_t incarnation, int64_t order, absl::Time now);
  // Records the registered process (identity, incarnation, host, device) as
  // heard from at `now`.
  void Register(Worker& worker, const v1::RegisterWorkerRequest& request,
                absl::Time now);
  // Gives `worker` rank `rank` of generation `generation` of `job_id`; its
  // collective count starts again at `now`.
  void Assign(Worker& worker, const std::string& job_id, int64_t generation,
              int rank, absl::Time now);
  // The worker holds no rank any more (its part ended or the generation did).
  static void Unassign(Worker& worker);
  // Records a heartbeat's collective count for the generation it runs.
  void Heartbeat(Worker& worker, const v1::Heartbeat& beat, absl::Time now);

  // Connected workers not heard from for longer than the heartbeat timeout.
  std::vector<Worker*> Silent(absl::Time now);
  // Workers with an open session.
  std::vector<Worker*> Connected();
  // The workers of `rank_workers` holding a rank of `job_id` whose
  // heartbeats have not named their generation for longer than the
  // heartbeat timeout since they were assigned it: they never joined it.
  std::vector<Worker*> NotJoined(const std::string& job_id,
                                 const std::vector<std::string>& rank_workers,
                                 absl::Time now);
  // Picks the workers for a generation of a job with `spec`, in rank order,
  // or none if not enough are here. A first generation (`previous` empty)
  // takes the static cluster's own tasks, or the connected idle workers
  // that are not spares. A later one keeps each rank of the previous
  // generation (`previous`, worker ids by rank) with the worker that held
  // it, and gives a rank whose worker is gone to a worker standing by at
  // once: in a static cluster the rank's own task if it is back, else an
  // idle worker that is not a spare, else a spare. An elastic job that
  // cannot fill a rank shrinks; spares never make it grow. Workers in
  // `reserved` (kept for other jobs) are never picked.
  std::vector<Worker*> Pick(const v1::JobSpec& spec,
                            const std::vector<std::string>& previous,
                            const std::set<std::string>& reserved = {});
  // Connected idle workers that could take a rank (not leaving): spares
  // and idle workers that are not spares alike. Not only spares on
  // purpose: Pick gives a failed rank to an idle worker that is not a spare
  // first (a static task back from a failure), so each of them is told to
  // stand by for the running job and load its data before it is needed.
  std::vector<Worker*> StandingBy();
  // The workers of `rank_workers` that still hold a rank of `job_id`.
  std::vector<Worker*> RanksOf(const std::string& job_id,
                               const std::vector<std::string>& rank_workers);
  // "rank 3 (worker:3 on host) stalled at collective #812 for 14 s", or ""
  // when no rank of `rank_workers` lags the others. Else, with 3 ranks or
  // more, the rank whose links every other rank finds at least 3x slower
  // than the rest: "rank 2 (worker:2 on host) has the slowest data-plane
  // link: its data reaches its peers at 11 MB/s, the others' at 112 MB/s".
  std::string Stall(const std::string& job_id,
                    const std::vector<std::string>& rank_workers,
                    absl::Time now) const;
  // Stall's second half, over the ranks' reported link rates.
  static std::string SlowLink(const std::vector<const Worker*>& ranks);

  // Forgets the free workers (free:N, no task identity) that have had no
  // session, no rank and no message for longer than `after`: processes that
  // went away. A static cluster's tasks stay. Returns their ids.
  std::vector<std::string> ForgetVanished(absl::Time now, absl::Duration after);

  // The workers, without incarnations (those are shown to nobody), in id
  // order: those after id `after` (from the first when empty), at most
  // `limit`; `more` (if given) says whether more follow.
  std::vector<v1::WorkerInfo> List(const std::string& after = "",
                                   size_t limit = SIZE_MAX,
                                   bool* more = nullptr) const;
  // Closes every open session (the coordinator is stopping).
  void CloseAll();

  // "free:1 (host 10.0.0.7, rank 1)".
  static std::string Describe(const Worker& worker);

 private:
  // Connected, idle and not leaving.
  static bool Available(const Worker& worker);
  std::vector<Worker*> PickStatic(const std::set<std::string>& reserved);
  std::vector<Worker*> RefillStatic(const std::vector<std::string>& previous,
                                    const std::set<std::string>& reserved);
  // The available workers not in `taken` nor `reserved`, the ones that are
  // not spares first, each by registration order.
  std::vector<Worker*> Replacements(const std::vector<Worker*>& taken,
                                    const std::set<std::string>& reserved);
  std::vector<Worker*> PickFree(const v1::JobSpec& spec,
                                const std::vector<std::string>& previous,
                                const std::set<std::string>& reserved);

  const std::optional<v1::ClusterSpec> cluster_;
  const absl::Duration heartbeat_timeout_;
  const absl::Duration stall_after_;
  std::map<std::string, Worker> workers_;
  int64_t next_order_ = 0;
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_WORKER_REGISTRY_H_
