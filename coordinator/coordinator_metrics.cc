// Coordinator::CollectMetrics: the coordinator's state as Prometheus metrics,
// gathered under its lock when a scrape comes. Every family is written on
// every scrape, with zeros for the states and causes not seen, so a rate()
// or a dashboard panel never starts from a missing series.
#include "coordinator/coordinator_metrics.h"

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_state.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_status.h"

namespace lockstep::coordinator {
namespace {

constexpr v1::JobState kJobStates[] = {
    v1::JOB_STATE_QUEUED,    v1::JOB_STATE_RUNNING, v1::JOB_STATE_RECOVERING,
    v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED,  v1::JOB_STATE_STOPPED};
constexpr const char* kWorkerStates[] = {"idle", "standby", "training",
                                         "disconnected"};

// Each active (running or recovering) job's progress, labelled with its id:
// one family at a time, every job's sample in it.
void WriteActiveJobs(const std::vector<const v1::JobStatus*>& jobs,
                     metrics::Exposition& out) {
  if (jobs.empty()) return;
  auto of = [](const v1::JobStatus& status) {
    return metrics::Labels{{"job", status.job_id()}};
  };
  struct Gauge {
    const char* name;
    const char* help;
    double (*value)(const v1::JobStatus&);
  };
  static constexpr Gauge kGauges[] = {
      {"lockstep_job_step", "Each running job's last completed step.",
       [](const v1::JobStatus& s) { return static_cast<double>(s.step()); }},
      {"lockstep_job_total_steps", "Each running job's planned steps.",
       [](const v1::JobStatus& s) {
         return static_cast<double>(s.total_steps());
       }},
      {"lockstep_job_epoch", "Each running job's epoch (from 0).",
       [](const v1::JobStatus& s) { return static_cast<double>(s.epoch()); }},
      {"lockstep_job_loss", "Each running job's last reported training loss.",
       [](const v1::JobStatus& s) { return static_cast<double>(s.loss()); }},
      {"lockstep_job_samples_per_second",
       "Each running job's training throughput over all ranks.",
       [](const v1::JobStatus& s) { return s.samples_per_second(); }},
      {"lockstep_job_generation",
       "Each running job's generation (each start or re-formation is one).",
       [](const v1::JobStatus& s) {
         return static_cast<double>(s.generation());
       }},
      {"lockstep_job_world_size", "Ranks in each running job's generation.",
       [](const v1::JobStatus& s) {
         return static_cast<double>(s.world_size());
       }},
  };
  for (const Gauge& gauge : kGauges) {
    out.Family(gauge.name, metrics::kGauge, gauge.help);
    for (const v1::JobStatus* status : jobs) {
      out.Sample(gauge.name, of(*status), gauge.value(*status));
    }
  }
  bool family = false;
  for (const v1::JobStatus* status : jobs) {
    if (status->tokens_per_second() <= 0) continue;
    if (!family) {
      family = out.Family(
          "lockstep_job_tokens_per_second", metrics::kGauge,
          "Each running language model's training throughput in tokens.");
    }
    out.Sample("lockstep_job_tokens_per_second", of(*status),
               status->tokens_per_second());
  }
  family = false;
  for (const v1::JobStatus* status : jobs) {
    if (!status->has_test_loss()) continue;
    if (!family) {
      family = out.Family("lockstep_job_test_loss", metrics::kGauge,
                          "Each running job's last test loss.");
    }
    out.Sample("lockstep_job_test_loss", of(*status), status->test_loss());
  }
  family = false;
  for (const v1::JobStatus* status : jobs) {
    if (status->evals().empty()) continue;
    if (!family) {
      family = out.Family("lockstep_job_last_eval_step", metrics::kGauge,
                          "The step of each running job's last evaluation "
                          "(its test loss and metrics are the gauges "
                          "beside).");
    }
    const v1::EvalPoint& last = *status->evals().rbegin();
    out.Sample("lockstep_job_last_eval_step", of(*status),
               static_cast<double>(last.step()));
  }
  family = false;
  for (const v1::JobStatus* status : jobs) {
    if (status->test_metrics().empty()) continue;
    // One family, the task's metric in a label: accuracy, mse, perplexity,
    // a training-step module's own (names checked when reported).
    if (!family) {
      family = out.Family(
          "lockstep_job_test_metric", metrics::kGauge,
          "Each running job's last test metrics, by the task's names "
          "(test_accuracy, test_mse, test_perplexity, ...).");
    }
    std::map<std::string, double> sorted(status->test_metrics().begin(),
                                         status->test_metrics().end());
    for (const auto& [name, value] : sorted) {
      metrics::Labels labels = of(*status);
      labels.push_back({"metric", name});
      out.Sample("lockstep_job_test_metric", labels, value);
    }
  }
  out.Family("lockstep_job_restarts_total", metrics::kCounter,
             "Restarts each running job has used (re-formations after a "
             "failure; preemptions are not counted).");
  for (const v1::JobStatus* status : jobs) {
    out.Sample("lockstep_job_restarts_total", of(*status),
               RestartsUsed(*status));
  }
}

// An owner as a label value: "none" for jobs submitted under --insecure.
std::string OwnerLabel(const v1::JobStatus& status) {
  return status.owner().empty() ? "none" : status.owner();
}

}  // namespace

void Coordinator::WriteSchedulingLocked(metrics::Exposition& out) {
  struct Tally {
    int running = 0;  // RUNNING or RECOVERING
    int workers = 0;  // the workers their latest generations hold
    int queued = 0;
    double oldest_wait = 0;
  };
  std::map<std::string, Tally> by_owner;
  std::map<int, Tally> by_priority;
  const absl::Time now = clock_->Now();
  for (const auto& [id, job] : jobs_) {
    const v1::JobState state = job.status.state();
    Tally& owner = by_owner[OwnerLabel(job.status)];
    Tally& priority = by_priority[job.status.priority()];
    if (state == v1::JOB_STATE_RUNNING || state == v1::JOB_STATE_RECOVERING) {
      for (Tally* tally : {&owner, &priority}) {
        ++tally->running;
        tally->workers += job.status.world_size();
      }
    } else if (state == v1::JOB_STATE_QUEUED) {
      const double waited = absl::ToDoubleSeconds(now - job.queued_at);
      for (Tally* tally : {&owner, &priority}) {
        ++tally->queued;
        tally->oldest_wait = std::max(tally->oldest_wait, waited);
      }
    }
  }
  const struct {
    const char* suffix;
    const char* help;
    std::function<double(const Tally&)> value;
  } gauges[] = {
      {"running_jobs", "running or recovering jobs",
       [](const Tally& t) { return static_cast<double>(t.running); }},
      {"workers", "workers held by running jobs",
       [](const Tally& t) { return static_cast<double>(t.workers); }},
      {"queued_jobs", "queued jobs",
       [](const Tally& t) { return static_cast<double>(t.queued); }},
      {"oldest_wait_seconds",
       "seconds the longest-waiting queued job has waited since it last "
       "entered the queue",
       [](const Tally& t) { return t.oldest_wait; }},
  };
  for (const auto& gauge : gauges) {
    const std::string name = absl::StrCat("lockstep_owner_", gauge.suffix);
    out.Family(name, metrics::kGauge,
               absl::StrCat("By owner (the submitter's role:name; none under "
                            "--insecure): ",
                            gauge.help, "."));
    for (const auto& [owner, tally] : by_owner) {
      out.Sample(name, {{"owner", owner}}, gauge.value(tally));
    }
  }
  for (const auto& gauge : gauges) {
    const std::string name = absl::StrCat("lockstep_priority_", gauge.suffix);
    out.Family(name, metrics::kGauge,
               absl::StrCat("By job priority: ", gauge.help, "."));
    for (const auto& [priority, tally] : by_priority) {
      out.Sample(name, {{"priority", absl::StrCat(priority)}},
                 gauge.value(tally));
    }
  }
  out.Family("lockstep_preemptions_total", metrics::kCounter,
             "Running jobs the scheduler stopped at an agreed step and sent "
             "back to the queue, for a job of a higher priority.");
  out.Sample("lockstep_preemptions_total", {}, static_cast<double>(yields_));
  out.Family("lockstep_preemptions_called_off_total", metrics::kCounter,
             "Preemptions called off because the job they were for started "
             "on other workers or left the queue first.");
  out.Sample("lockstep_preemptions_called_off_total", {},
             static_cast<double>(called_off_));
  // Each owner with a quota: the quota, and what counts against it (every
  // active job's whole group, as the scheduler charges it).
  const auto& quotas = scheduler_.policy().quotas;
  if (quotas.empty()) return;
  std::map<std::string, int> charged;
  for (Job* job : ActiveJobsLocked()) {
    charged[job->status.owner()] += OwnerChargeLocked(*job);
  }
  out.Family("lockstep_owner_quota_workers", metrics::kGauge,
             "By owner with a --quota: the most workers its jobs may hold.");
  for (const auto& [owner, quota] : quotas) {
    out.Sample("lockstep_owner_quota_workers", {{"owner", owner}}, quota);
  }
  out.Family("lockstep_owner_charged_workers", metrics::kGauge,
             "By owner with a --quota: the workers its active jobs are "
             "charged against it (each job's whole group, also while it "
             "recovers).");
  for (const auto& [owner, quota] : quotas) {
    out.Sample("lockstep_owner_charged_workers", {{"owner", owner}},
               charged[owner]);
  }
}

const std::vector<std::string>& FailureEventKinds() {
  static const auto* kinds = new std::vector<std::string>{
      "worker_failed",   "worker_restarted",  "worker_reconnected",
      "rank_failed",     "generation_failed", "checkpoint_failed",
      "identity_revoked"};
  return *kinds;
}

bool IsFailureEvent(absl::string_view kind) {
  const auto& kinds = FailureEventKinds();
  return std::find(kinds.begin(), kinds.end(), kind) != kinds.end();
}

void Coordinator::CollectMetrics(metrics::Exposition& out) {
  absl::MutexLock lock(&mu_);
  std::map<v1::JobState, int> jobs;
  for (const auto& [id, job] : jobs_) ++jobs[job.status.state()];
  out.Family("lockstep_jobs", metrics::kGauge,
             "Jobs the coordinator holds, by state.");
  for (v1::JobState state : kJobStates) {
    out.Sample("lockstep_jobs", {{"state", StateName(state)}}, jobs[state]);
  }
  std::vector<const v1::JobStatus*> active;
  for (const Job* job : ActiveJobsLocked()) active.push_back(&job->status);
  WriteActiveJobs(active, out);
  WriteSchedulingLocked(out);

  const std::vector<v1::WorkerInfo> workers = workers_.List();
  std::map<std::string, int> by_state;
  for (const v1::WorkerInfo& worker : workers) ++by_state[worker.state()];
  out.Family("lockstep_workers", metrics::kGauge,
             "Registered workers, by state.");
  for (const char* state : kWorkerStates) {
    out.Sample("lockstep_workers", {{"state", state}}, by_state[state]);
  }
  out.Family("lockstep_worker_last_heard_seconds", metrics::kGauge,
             "Seconds since the coordinator last heard from each worker.");
  const double now = NowSeconds();
  for (const v1::WorkerInfo& worker : workers) {
    out.Sample("lockstep_worker_last_heard_seconds",
               {{"worker", worker.worker_id()}},
               std::max(0.0, now - worker.last_heartbeat()));
  }
  out.Family("lockstep_worker_blas_info", metrics::kGauge,
             "The BLAS kernel set each worker runs and who chose it "
             "(openblas, lockstep, environment, fallback): a mixed pool "
             "shows here (always 1).");
  for (const v1::WorkerInfo& worker : workers) {
    out.Sample("lockstep_worker_blas_info",
               {{"worker", worker.worker_id()},
                {"blas_kernel", worker.device().blas_kernel()},
                {"blas_kernel_source", worker.device().blas_kernel_source()}},
               1);
  }

  out.Family("lockstep_failures_total", metrics::kCounter,
             "Failures seen in jobs, by cause (the job event's kind).");
  for (const std::string& cause : FailureEventKinds()) {
    const auto it = failures_.find(cause);
    out.Sample("lockstep_failures_total", {{"cause", cause}},
               it == failures_.end() ? 0 : it->second);
  }
  out.Family("lockstep_checkpoint_commits_total", metrics::kCounter,
             "Checkpoints committed (every rank prepared, the chief "
             "committed).");
  out.Sample("lockstep_checkpoint_commits_total", {},
             static_cast<double>(commits_));
  out.Family("lockstep_checkpoint_commit_seconds", metrics::kHistogram,
             "Seconds from the first rank's prepare of a checkpoint to the "
             "chief's commit.");
  out.Observations("lockstep_checkpoint_commit_seconds", {}, commit_seconds_);
}

}  // namespace lockstep::coordinator
