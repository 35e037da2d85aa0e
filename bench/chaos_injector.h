// The chaos soak's fault execution: draws the schedule, carries out each
// fault kind against the processes, and follows the job until it resumed.
#ifndef LOCKSTEP_BENCH_CHAOS_INJECTOR_H_
#define LOCKSTEP_BENCH_CHAOS_INJECTOR_H_

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bench/chaos_faults.h"
#include "bench/chaos_report.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::chaos {

// The static cluster's workers.
inline constexpr int kWorkers = 3;
// A worker's --preempt-grace: the supervisor starts workers with it.
inline constexpr int kPreemptGrace = 15;

// "exited N" or "killed by signal N", for a wait status.
std::string HowExited(int status);

// The processes faults are carried out against, as the supervisor runs
// them. A name is the one the process's exit report carries.
class Cluster {
 public:
  virtual ~Cluster() = default;
  virtual pid_t worker_pid(int index) const = 0;
  virtual const std::string& worker_name(int index) const = 0;
  virtual pid_t coordinator_pid() const = 0;
  virtual std::string coordinator_name() const = 0;
  // Starts worker `index` again (a new process, a new name).
  virtual void RestartWorker(int index) = 0;
  // Starts the coordinator again on its address and state dir; false if it
  // did not come up.
  virtual bool RestartCoordinator() = 0;
  // On the network test bed: the link of worker `index` (-1: the
  // coordinator's host) cut at the switch and healed, or capped to a slow
  // rate and restored. False (the fault is noted) if that failed.
  virtual bool Cut(int index) = 0;
  virtual bool Heal(int index) = 0;
  virtual bool Slow(int index) = 0;
  virtual bool Unslow(int index) = 0;
};

// Carries out the soak's faults. Start() draws the schedule (from the seed
// alone) and starts the run's clock; then, once per poll, the supervisor
// calls RunDueActions(), passes on process exits (Exited) and the job's
// status (Advance); Finish() collects what went wrong. A fault is current
// from its injection until the job resumed training, or until the next one
// goes into its recovery; only then is the next injected.
//
// Not thread-safe: the supervisor's thread makes every call.
class FaultInjector {
 public:
  // `options` and `cluster` must outlive the injector.
  FaultInjector(const Options& options, Cluster& cluster);

  // Draws every fault, prints the plan and starts the clock.
  void Start();

  // Runs the restarts and SIGCONTs that are due.
  void RunDueActions();

  // Whether a process exit was this injector's doing (a kill, a
  // preemption); a preempted worker is restarted after its delay. Other
  // exits are the supervisor's to note and restart.
  bool Exited(const std::string& name, int status);

  // One step of the schedule: see whether the current fault is over, and
  // inject the next once the job trained enough since.
  void Advance(const v1::JobStatus& status);

  // Notes a problem on the current fault, or on the run without one; it is
  // printed on stderr at once.
  void Note(const std::string& problem);

  // Reports the fault the job never resumed from, if any, and returns every
  // problem noted: the run's, then each fault's.
  std::vector<std::string> Finish();

  // Sends SIGCONT to a worker a stop fault holds, so that it can exit.
  void ContinueStopped();

  // Seconds since Start().
  double Elapsed() const;
  absl::Time start() const { return start_; }
  const std::deque<Fault>& faults() const { return faults_; }

 private:
  // A task for later: a restart, a SIGCONT.
  struct Action {
    absl::Time when;
    std::function<void()> run;
  };

  double Uniform(double low, double high);
  void Later(double seconds, std::function<void()> run);
  void Plan();
  void Inject(const v1::JobStatus& status);
  bool Settle(const v1::JobStatus& status);
  bool Resumed(const v1::JobStatus& status);
  bool Overlap(const v1::JobStatus& status);
  void CheckLiveRecovery();

  const Options& options_;
  Cluster& cluster_;
  std::mt19937 random_;
  absl::Time start_;
  pid_t stopped_ = -1;     // the worker held by SIGSTOP, if any
  int64_t last_step_ = 0;  // the job's step in the last status
  std::set<std::string> expected_exits_;
  std::string preempted_;  // the SIGTERMed worker until it exits
  bool preempt_killed_ = false;
  std::vector<Action> actions_;
  std::vector<Fault> plan_;   // drawn before the run (Plan)
  std::deque<Fault> faults_;  // a deque: current_ points into it
  Fault* current_ = nullptr;  // the fault the job has not resumed from
  bool late_noted_ = false;
  // A kill-all since the last fault the job resumed from.
  bool chain_lost_live_state_ = false;
  // The most advanced step before the last restore: until the job passes it
  // again, it re-trains steps a kill-all repeated.
  int64_t replay_until_ = 0;
  bool near_end_noted_ = false;
  int64_t next_at_step_ = 0;
  std::vector<std::string> other_problems_;
};

}  // namespace lockstep::chaos

#endif  // LOCKSTEP_BENCH_CHAOS_INJECTOR_H_
