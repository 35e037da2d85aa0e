// The arithmetic of lockstep's all-reduce algorithms, shared by its data-plane
// transports (mesh_communicator.h, gloo_communicator.h), so that every
// transport forms each element's sum the same way, bit for bit.
//
// Thread-safe: functions of their arguments.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_REDUCE_H_
#define LOCKSTEP_WORKER_COLLECTIVE_REDUCE_H_

#include <cstddef>
#include <utility>
#include <vector>

#include "worker/collective/communicator.h"

namespace lockstep::worker {

// Chunk `i` of `count` elements split `parts` ways: [begin, end). The
// first count % parts chunks are one element longer.
std::pair<size_t, size_t> Chunk(size_t count, int parts, int i);

// dst[i] += src[i] for `count` elements of `type` (16-bit ones added in
// fp32 and rounded back): the ring's step.
void AddInto(char* dst, const char* src, size_t count, DataType type);

// The direct algorithm's sum of the chunk [begin, begin + count) that rank
// `me` of `world` owns: its own elements in `data` and each peer's in
// `scratch` (one `stride`-element block per peer, rank order, `me`
// skipped), added in rank order x0 + x1 + ... in fp32 and written back to
// `data` (16-bit types rounded once). `accumulator` is reused space.
void SumInRankOrder(void* data, const char* scratch, size_t begin, size_t count,
                    size_t stride, DataType type, int me, int world,
                    std::vector<float>* accumulator);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_REDUCE_H_
