// The pending rendezvous calls, indexed by what they wait on
// (rendezvous_waits.h).
#include "coordinator/rendezvous_waits.h"

#include <limits>
#include <utility>

namespace lockstep::coordinator {

RendezvousWaits::WaitId RendezvousWaits::Add(Wait wait) {
  const WaitId id = next_id_++;
  auto index =
      by_key_.emplace(Key{wait.job_id, wait.generation, wait.name}, id);
  waits_.emplace(id, Entry{std::move(wait), index});
  return id;
}

RendezvousWaits::Wait* RendezvousWaits::Find(WaitId id) {
  auto it = waits_.find(id);
  return it == waits_.end() ? nullptr : &it->second.wait;
}

RendezvousWaits::Wait RendezvousWaits::Take(WaitId id) {
  auto it = waits_.find(id);
  Wait wait = std::move(it->second.wait);
  by_key_.erase(it->second.index);
  waits_.erase(it);
  return wait;
}

std::vector<RendezvousWaits::WaitId> RendezvousWaits::On(
    const std::string& job_id, int64_t generation,
    const std::string& name) const {
  std::vector<WaitId> ids;
  auto [begin, end] = by_key_.equal_range(Key{job_id, generation, name});
  for (auto it = begin; it != end; ++it) ids.push_back(it->second);
  return ids;
}

std::vector<RendezvousWaits::WaitId> RendezvousWaits::OfJob(
    const std::string& job_id) const {
  std::vector<WaitId> ids;
  for (auto it = by_key_.lower_bound(
           Key{job_id, std::numeric_limits<int64_t>::min(), ""});
       it != by_key_.end() && std::get<0>(it->first) == job_id; ++it) {
    ids.push_back(it->second);
  }
  return ids;
}

std::vector<RendezvousWaits::WaitId> RendezvousWaits::All() const {
  std::vector<WaitId> ids;
  ids.reserve(waits_.size());
  for (const auto& [id, entry] : waits_) ids.push_back(id);
  return ids;
}

}  // namespace lockstep::coordinator
