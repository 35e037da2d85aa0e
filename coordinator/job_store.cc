// The coordinator's job state in SQLite: opening the database, saving,
// deleting and loading every job's status (job_store.h).
#include "coordinator/job_store.h"

#include <sqlite3.h>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace lockstep::coordinator {
namespace {

// Finalizes a prepared statement on every path out of a scope.
class Statement {
 public:
  explicit Statement(sqlite3_stmt* stmt) : stmt_(stmt) {}
  ~Statement() { sqlite3_finalize(stmt_); }
  sqlite3_stmt* get() { return stmt_; }

 private:
  sqlite3_stmt* stmt_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(
    const std::string& state_dir) {
  RETURN_IF_ERROR(MakeDirectories(state_dir));
  std::string path = absl::StrCat(state_dir, "/coordinator.db");
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open the state database ", path, ": ", message,
                     "; check that --state-dir is writable"));
  }
  std::unique_ptr<JobStore> store(new JobStore(db, path));
  sqlite3_busy_timeout(db, 5000);
  // Read before anything is written: a newer lockstep's database is left
  // as it was.
  absl::StatusOr<int> version = store->SchemaVersion();
  if (!version.ok()) {
    return absl::DataLossError(absl::StrCat(
        "the state database ", path, " is unreadable (",
        version.status().message(),
        "); it is corrupt or not a lockstep state dir. Restore it from a "
        "backup, or move it away to start with no jobs"));
  }
  if (*version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the state database ", path, " has schema version ", *version,
        ", newer than this coordinator's ", kSchemaVersion,
        ": a newer lockstep wrote it. Run that release (or a newer one) on "
        "this --state-dir; it was left untouched"));
  }
  RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL"));
  RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=FULL"));
  RETURN_IF_ERROR(store->Migrate(*version));
  return store;
}

JobStore::~JobStore() { sqlite3_close(db_); }

absl::StatusOr<int> JobStore::SchemaVersion() {
  sqlite3_stmt* raw = nullptr;
  if (sqlite3_prepare_v2(db_, "PRAGMA user_version", -1, &raw, nullptr) !=
      SQLITE_OK) {
    sqlite3_finalize(raw);
    return absl::DataLossError(sqlite3_errmsg(db_));
  }
  Statement stmt(raw);
  if (sqlite3_step(raw) != SQLITE_ROW) {
    return absl::DataLossError(sqlite3_errmsg(db_));
  }
  return sqlite3_column_int(raw, 0);
}

absl::Status JobStore::Migrate(int from) {
  if (from == kSchemaVersion) return absl::OkStatus();
  // Version 0 is also a new, empty database: nothing to say of that.
  bool had_tables = false;
  {
    sqlite3_stmt* raw = nullptr;
    sqlite3_prepare_v2(db_, "SELECT count(*) FROM sqlite_master", -1, &raw,
                       nullptr);
    Statement count(raw);
    had_tables =
        sqlite3_step(raw) == SQLITE_ROW && sqlite3_column_int(raw, 0) > 0;
  }
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::Status migrated = [&]() -> absl::Status {
    if (from < 1) {
      // Version 0 had the jobs table already, or nothing (a new database).
      RETURN_IF_ERROR(
          Exec("CREATE TABLE IF NOT EXISTS jobs ("
               "  job_id TEXT PRIMARY KEY,"
               "  status BLOB NOT NULL)"));
    }
    if (from < 2) {
      RETURN_IF_ERROR(
          Exec("CREATE TABLE IF NOT EXISTS workers ("
               "  worker_id TEXT PRIMARY KEY,"
               "  identity TEXT NOT NULL,"
               "  incarnation INTEGER NOT NULL,"
               "  registration INTEGER NOT NULL)"));
    }
    return Exec(absl::StrCat("PRAGMA user_version=", kSchemaVersion).c_str());
  }();
  if (!migrated.ok()) {
    (void)Exec("ROLLBACK");
    return migrated;
  }
  RETURN_IF_ERROR(Exec("COMMIT"));
  if (had_tables) {
    LogInfo("state database ", path_, ": migrated from schema version ", from,
            " to ", kSchemaVersion);
  }
  return absl::OkStatus();
}

absl::Status JobStore::Exec(const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    std::string message = error ? error : "unknown error";
    sqlite3_free(error);
    return absl::InternalError(
        absl::StrCat("state database ", path_, ": ", message));
  }
  return absl::OkStatus();
}

absl::Status JobStore::Save(const v1::JobStatus& status) {
  std::string blob;
  status.SerializeToString(&blob);
  sqlite3_stmt* raw = nullptr;
  sqlite3_prepare_v2(
      db_,
      "INSERT INTO jobs (job_id, status) VALUES (?1, ?2) "
      "ON CONFLICT(job_id) DO UPDATE SET status = excluded.status",
      -1, &raw, nullptr);
  Statement stmt(raw);
  sqlite3_bind_text(raw, 1, status.job_id().c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_blob(raw, 2, blob.data(), static_cast<int>(blob.size()),
                    SQLITE_TRANSIENT);
  if (sqlite3_step(raw) != SQLITE_DONE) {
    return absl::UnavailableError(absl::StrCat("cannot save job ",
                                               status.job_id(), " to ", path_,
                                               ": ", sqlite3_errmsg(db_)));
  }
  return absl::OkStatus();
}

absl::Status JobStore::Delete(const std::string& job_id) {
  return DeleteRow("DELETE FROM jobs WHERE job_id = ?1", "job", job_id);
}

absl::Status JobStore::DeleteRow(const char* sql, const char* what,
                                 const std::string& id) {
  sqlite3_stmt* raw = nullptr;
  sqlite3_prepare_v2(db_, sql, -1, &raw, nullptr);
  Statement stmt(raw);
  sqlite3_bind_text(raw, 1, id.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(raw) != SQLITE_DONE) {
    return absl::UnavailableError(absl::StrCat("cannot delete ", what, " ", id,
                                               " from ", path_, ": ",
                                               sqlite3_errmsg(db_)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::JobStatus>> JobStore::LoadAll() {
  sqlite3_stmt* raw = nullptr;
  sqlite3_prepare_v2(db_, "SELECT job_id, status FROM jobs ORDER BY rowid", -1,
                     &raw, nullptr);
  Statement stmt(raw);
  std::vector<v1::JobStatus> jobs;
  int rc;
  while ((rc = sqlite3_step(raw)) == SQLITE_ROW) {
    v1::JobStatus status;
    const void* blob = sqlite3_column_blob(raw, 1);
    int size = sqlite3_column_bytes(raw, 1);
    if (!status.ParseFromArray(blob, size)) {
      return absl::DataLossError(absl::StrCat(
          "state database ", path_, ": the record of job ",
          reinterpret_cast<const char*>(sqlite3_column_text(raw, 0)),
          " does not parse; restore the database from a backup or move it "
          "away to start empty"));
    }
    jobs.push_back(std::move(status));
  }
  if (rc != SQLITE_DONE) {
    return absl::DataLossError(
        absl::StrCat("cannot read ", path_, ": ", sqlite3_errmsg(db_)));
  }
  return jobs;
}

absl::Status JobStore::SaveWorkers(const std::vector<WorkerRecord>& records) {
  if (records.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  for (const WorkerRecord& record : records) {
    if (absl::Status saved = SaveWorker(record); !saved.ok()) {
      (void)Exec("ROLLBACK");
      return saved;
    }
  }
  return Exec("COMMIT");
}

absl::Status JobStore::SaveWorker(const WorkerRecord& record) {
  sqlite3_stmt* raw = nullptr;
  sqlite3_prepare_v2(
      db_,
      "INSERT INTO workers (worker_id, identity, incarnation, registration) "
      "VALUES (?1, ?2, ?3, ?4) ON CONFLICT(worker_id) DO UPDATE SET "
      "identity = excluded.identity, incarnation = excluded.incarnation, "
      "registration = excluded.registration",
      -1, &raw, nullptr);
  Statement stmt(raw);
  sqlite3_bind_text(raw, 1, record.worker_id.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(raw, 2, record.identity.c_str(), -1, SQLITE_TRANSIENT);
  // SQLite's integers are signed: the incarnation's 64 bits as they are.
  sqlite3_bind_int64(raw, 3, static_cast<sqlite3_int64>(record.incarnation));
  sqlite3_bind_int64(raw, 4, record.order);
  if (sqlite3_step(raw) != SQLITE_DONE) {
    return absl::UnavailableError(absl::StrCat("cannot save worker ",
                                               record.worker_id, " to ", path_,
                                               ": ", sqlite3_errmsg(db_)));
  }
  return absl::OkStatus();
}

absl::Status JobStore::DeleteWorker(const std::string& worker_id) {
  return DeleteRow("DELETE FROM workers WHERE worker_id = ?1", "worker",
                   worker_id);
}

absl::StatusOr<std::vector<JobStore::WorkerRecord>> JobStore::LoadWorkers() {
  sqlite3_stmt* raw = nullptr;
  sqlite3_prepare_v2(db_,
                     "SELECT worker_id, identity, incarnation, registration "
                     "FROM workers ORDER BY registration",
                     -1, &raw, nullptr);
  Statement stmt(raw);
  std::vector<WorkerRecord> workers;
  int rc;
  while ((rc = sqlite3_step(raw)) == SQLITE_ROW) {
    WorkerRecord record;
    const unsigned char* id = sqlite3_column_text(raw, 0);
    const unsigned char* identity = sqlite3_column_text(raw, 1);
    record.worker_id = id != nullptr ? reinterpret_cast<const char*>(id) : "";
    record.identity =
        identity != nullptr ? reinterpret_cast<const char*>(identity) : "";
    record.incarnation = static_cast<uint64_t>(sqlite3_column_int64(raw, 2));
    record.order = sqlite3_column_int64(raw, 3);
    workers.push_back(std::move(record));
  }
  if (rc != SQLITE_DONE) {
    return absl::DataLossError(
        absl::StrCat("cannot read ", path_, ": ", sqlite3_errmsg(db_)));
  }
  return workers;
}

}  // namespace lockstep::coordinator
