// The size limit of one gRPC message between lockstep's processes.
//
// gRPC refuses a message over 4 MiB by default; the largest payload the
// protocol documents is a 4 MiB KV value (coordinator/message_checks.h),
// which arrives wrapped in its request (job id, key, generation). Every
// server and channel of lockstep's control plane uses this one limit, so a
// payload that passes the coordinator's checks is never refused by gRPC on
// the way, and responses stay below it by paging (docs/PROTOCOL.md).
#ifndef LOCKSTEP_COMMON_RPC_LIMITS_H_
#define LOCKSTEP_COMMON_RPC_LIMITS_H_

namespace lockstep {

inline constexpr int kMaxRpcMessageBytes = (4 << 20) + (64 << 10);

// The bytes of one message of an artifact's upload or download
// (UploadArtifact, DownloadArtifact): well below the limit above.
inline constexpr int kMaxArtifactChunkBytes = 1 << 20;

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_RPC_LIMITS_H_
