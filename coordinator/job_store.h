// Durable job state: one SQLite database in the coordinator's state dir.
// Every job's JobStatus (spec, state, results, loss history) is written on
// each state transition with synchronous=FULL, so a coordinator restart sees
// every job it had accepted.
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
  // Opens (creating if needed) `state_dir`/coordinator.db. Errors:
  // DataLoss for a corrupt file, FailedPrecondition for a newer schema.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(
      const std::string& state_dir);
  ~JobStore();

  // Inserts or replaces the job's record.
  absl::Status Save(const v1::JobStatus& status);
  // Removes the job's record; a job it does not hold is no error.
  absl::Status Delete(const std::string& job_id);
  // Every job, in submission order.
  absl::StatusOr<std::vector<v1::JobStatus>> LoadAll();

 private:
  // Version 1: table jobs(job_id, status = serialized v1.JobStatus).
  static constexpr int kSchemaVersion = 1;

  JobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  // Creates the tables of a new database; refuses one from a newer schema.
  absl::Status CheckSchema();
  absl::Status Exec(const char* sql);

  sqlite3* db_;
  std::string path_;
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_JOB_STORE_H_
