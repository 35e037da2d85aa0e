// bfloat16 and IEEE fp16 <-> fp32 conversions for the collectives, which
// must not depend on LibTorch. Rounding is to nearest, ties to even; NaN
// stays NaN and overflow becomes infinity, as on GPUs.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_HALF_H_
#define LOCKSTEP_WORKER_COLLECTIVE_HALF_H_

#include <cstdint>

namespace lockstep::worker {

float BFloat16ToFloat(uint16_t bits);
uint16_t FloatToBFloat16(float value);
float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_HALF_H_
