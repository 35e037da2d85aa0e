// The data plane's per-peer throughput (link_meter.h).
#include "worker/collective/link_meter.h"

namespace lockstep::worker {

void LinkMeter::Reset(int world) {
  absl::MutexLock lock(&mu_);
  bytes_.assign(world > 0 ? world : 0, 0.0);
  seconds_.assign(world > 0 ? world : 0, 0.0);
}

void LinkMeter::Record(int peer, size_t bytes, double seconds) {
  if (bytes < kMinBytes || seconds <= 0) return;
  absl::MutexLock lock(&mu_);
  if (peer < 0 || peer >= static_cast<int>(bytes_.size())) return;
  bytes_[peer] = bytes_[peer] * kDecay + static_cast<double>(bytes);
  seconds_[peer] = seconds_[peer] * kDecay + seconds;
}

std::vector<double> LinkMeter::Rates() const {
  absl::MutexLock lock(&mu_);
  std::vector<double> rates(bytes_.size(), 0.0);
  for (size_t peer = 0; peer < rates.size(); ++peer) {
    if (seconds_[peer] > 0) rates[peer] = bytes_[peer] / seconds_[peer] / 1e6;
  }
  return rates;
}

}  // namespace lockstep::worker
