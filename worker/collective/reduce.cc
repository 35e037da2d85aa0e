// The all-reduce arithmetic both transports share (reduce.h).
#include "worker/collective/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "worker/collective/half.h"

namespace lockstep::worker {

// dst[i] += src[i] for `count` elements of `type` (16-bit ones added in
// fp32 and rounded back).
void AddInto(char* dst, const char* src, size_t count, DataType type) {
  switch (type) {
    case DataType::kFloat32: {
      float* out = reinterpret_cast<float*>(dst);
      const float* in = reinterpret_cast<const float*>(src);
      for (size_t i = 0; i < count; ++i) out[i] += in[i];
      break;
    }
    case DataType::kBFloat16:
    case DataType::kFloat16: {
      uint16_t* out = reinterpret_cast<uint16_t*>(dst);
      const uint16_t* in = reinterpret_cast<const uint16_t*>(src);
      const bool bf16 = type == DataType::kBFloat16;
      for (size_t i = 0; i < count; ++i) {
        out[i] = bf16 ? FloatToBFloat16(BFloat16ToFloat(out[i]) +
                                        BFloat16ToFloat(in[i]))
                      : FloatToHalf(HalfToFloat(out[i]) + HalfToFloat(in[i]));
      }
      break;
    }
  }
}

// Chunk `i` of `count` elements split `parts` ways: [begin, end).
std::pair<size_t, size_t> Chunk(size_t count, int parts, int i) {
  size_t base = count / parts, extra = count % parts;
  size_t begin = i * base + std::min<size_t>(i, extra);
  return {begin, begin + base + (static_cast<size_t>(i) < extra ? 1 : 0)};
}

namespace {

// Adds (or, with `first`, copies) `count` elements of `type` into `sum`.
void Accumulate(const char* in, size_t count, DataType type, bool first,
                float* sum) {
  switch (type) {
    case DataType::kFloat32: {
      const float* x = reinterpret_cast<const float*>(in);
      if (first) {
        std::memcpy(sum, x, count * sizeof(float));
      } else {
        for (size_t i = 0; i < count; ++i) sum[i] += x[i];
      }
      break;
    }
    case DataType::kBFloat16:
    case DataType::kFloat16: {
      const uint16_t* x = reinterpret_cast<const uint16_t*>(in);
      auto to_float =
          type == DataType::kBFloat16 ? BFloat16ToFloat : HalfToFloat;
      for (size_t i = 0; i < count; ++i) {
        float value = to_float(x[i]);
        sum[i] = first ? value : sum[i] + value;
      }
      break;
    }
  }
}

}  // namespace

void SumInRankOrder(void* data, const char* scratch, size_t begin, size_t count,
                    size_t stride, DataType type, int me, int world,
                    std::vector<float>* accumulator) {
  // A rank's chunk is empty when there are fewer elements than ranks; the
  // empty accumulator's null data() must not reach memcpy (UBSan).
  if (count == 0) return;
  const size_t esize = ElementSize(type);
  if (accumulator->size() < count) accumulator->resize(count);
  float* sum = accumulator->data();
  char* mine = static_cast<char*>(data) + begin * esize;
  // Rank by rank, so each element's sum is x0 + x1 + ... in that order.
  for (int r = 0; r < world; ++r) {
    const char* in =
        r == me ? mine : scratch + (r < me ? r : r - 1) * stride * esize;
    Accumulate(in, count, type, r == 0, sum);
  }
  switch (type) {
    case DataType::kFloat32:
      std::memcpy(mine, sum, count * sizeof(float));
      break;
    case DataType::kBFloat16:
    case DataType::kFloat16: {
      uint16_t* out = reinterpret_cast<uint16_t*>(mine);
      auto to_half =
          type == DataType::kBFloat16 ? FloatToBFloat16 : FloatToHalf;
      for (size_t i = 0; i < count; ++i) out[i] = to_half(sum[i]);
      break;
    }
  }
}

}  // namespace lockstep::worker
