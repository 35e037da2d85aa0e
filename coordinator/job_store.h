// Durable job state: one SQLite database in the coordinator's state dir.
// Every job's JobStatus (spec, state, results, loss history) is written on
// each state transition with synchronous=FULL, so a coordinator restart sees
// every job it had accepted; and the id each free worker process was given,
// so that after a restart the same process gets the same id back and every
// job's ranks still name the workers that hold their live state.
//
// Thread-compatible: the Coordinator calls it under its own lock.
#ifndef LOCKSTEP_COORDINATOR_JOB_STORE_H_
#define LOCKSTEP_COORDINATOR_JOB_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lockstep/v1/coordinator.pb.h"

struct sqlite3;

namespace lockstep::coordinator {

class JobStore {
 public:
  // Opens (creating if needed) `state_dir`/coordinator.db and brings an
  // older schema up to this one, in one transaction. Errors: DataLoss for a
  // corrupt file; FailedPrecondition for a newer schema (a newer lockstep
  // wrote it), refused before anything is written to it.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(
      const std::string& state_dir);
  ~JobStore();

  // Inserts or replaces the job's record.
  absl::Status Save(const v1::JobStatus& status);
  // Removes the job's record; a job it does not hold is no error.
  absl::Status Delete(const std::string& job_id);
  // Every job, in submission order.
  absl::StatusOr<std::vector<v1::JobStatus>> LoadAll();

  // A free worker process as the coordinator named it.
  struct WorkerRecord {
    std::string worker_id;  // "free:N"
    std::string identity;   // the SPIFFE ID that registered it
    uint64_t incarnation = 0;
    int64_t order = 0;  // registration order
  };
  // Inserts or replaces the workers' records, in one transaction (one
  // sync for a burst of registrations).
  absl::Status SaveWorkers(const std::vector<WorkerRecord>& records);
  // Removes it; a worker it does not hold is no error.
  absl::Status DeleteWorker(const std::string& worker_id);
  // Every free worker recorded, in registration order.
  absl::StatusOr<std::vector<WorkerRecord>> LoadWorkers();

 private:
  // The schema's version, in SQLite's user_version:
  //   0  a new database, or one of a coordinator from before the version
  //      was kept: table jobs(job_id, status = serialized v1.JobStatus)
  //   1  the same tables, the version kept
  //   2  table workers(worker_id, identity, incarnation, registration):
  //      free workers keep their ids across coordinator restarts
  // A new version adds its step to Migrate.
  static constexpr int kSchemaVersion = 2;

  JobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  // The database's schema version. Errors: DataLoss when it cannot be read
  // (not a SQLite database, or corrupt).
  absl::StatusOr<int> SchemaVersion();
  // Brings a database of schema `from` (<= kSchemaVersion) to
  // kSchemaVersion in one transaction.
  absl::Status Migrate(int from);
  absl::Status Exec(const char* sql);
  // One record, inside SaveWorkers' transaction.
  absl::Status SaveWorker(const WorkerRecord& record);
  // Runs `sql`, a DELETE whose ?1 is `id`; errors name the `what` and id.
  absl::Status DeleteRow(const char* sql, const char* what,
                         const std::string& id);

  sqlite3* db_;
  std::string path_;
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_JOB_STORE_H_
