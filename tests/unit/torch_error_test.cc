// LibTorch exception messages become one sentence: the backtrace that
// c10::Error appends never reaches a job's error.
#include "worker/train/torch_error.h"

#include <gtest/gtest.h>

namespace lockstep::worker {
namespace {

TEST(TorchErrorTest, KeepsOnlyTheMessageOfABacktrace) {
  // The shape of c10::Error::what(), abridged from a real one.
  const char* what =
      "The size of tensor a (3) must match the size of tensor b (4) at "
      "non-singleton dimension 1\n"
      "Exception raised from infer_size_impl at "
      "../aten/src/ATen/ExpandUtils.cpp:35 (most recent call first):\n"
      "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57\n"
      "frame #1: at::infer_size_dimvector + 0x3b2\n";
  EXPECT_EQ(TorchErrorSentence(what),
            "The size of tensor a (3) must match the size of tensor b (4) at "
            "non-singleton dimension 1");
}

TEST(TorchErrorTest, SkipsLeadingBlankLinesAndTrimsSpace) {
  EXPECT_EQ(TorchErrorSentence("\n  \n  out of memory  \nframe #0"),
            "out of memory");
  EXPECT_EQ(TorchErrorSentence("one line"), "one line");
}

TEST(TorchErrorTest, AnEmptyMessageStillSaysSomething) {
  EXPECT_EQ(TorchErrorSentence(""), "an error without a message");
  EXPECT_EQ(TorchErrorSentence("\n \n"), "an error without a message");
}

}  // namespace
}  // namespace lockstep::worker
