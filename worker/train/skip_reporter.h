// Tells the coordinator which records of the job's data this rank skipped
// (data.skip_corrupt): each record of each split once per generation, as
// soon as a step finds it. Every rank sends its own; the coordinator counts
// each record once, whoever reports it, and fails the job past the limit.
//
// Thread-compatible: the training thread owns it.
#ifndef LOCKSTEP_WORKER_TRAIN_SKIP_REPORTER_H_
#define LOCKSTEP_WORKER_TRAIN_SKIP_REPORTER_H_

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/v1/coordinator.pb.h"
#include "worker/data/skip_log.h"
#include "worker/data/split_source.h"

namespace lockstep::worker {

// Records per message, and the bytes of each reason sent.
inline constexpr int kMaxSkippedPerMessage = 100;
inline constexpr size_t kMaxSkipReasonBytes = 512;

class SkipReporter {
 public:
  using Send = std::function<void(const v1::WorkerMessage&)>;

  SkipReporter(const v1::Assignment& assignment, Send send)
      : assignment_(assignment), send_(std::move(send)) {}

  // Reports what `split` skips (nothing for a strict split or null).
  void Watch(const SplitSource* split);
  // Sends the records skipped since the last call.
  void SendNew();

 private:
  struct Watched {
    const SkipLog* log;
    size_t sent = 0;
  };
  const v1::Assignment& assignment_;
  const Send send_;
  std::vector<Watched> watched_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_SKIP_REPORTER_H_
