// The deny list of revoked identities (--deny-identities): read at start,
// read again when the file changes, a bad version keeps the last good list.
#include "common/deny_list.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/files.h"

namespace lockstep {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kAlice[] = "spiffe://lockstep/operator/alice";
constexpr char kWorker3[] = "spiffe://lockstep/worker/worker/3";

class DenyListTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/deny_list_test.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/deny.txt";
  }
  void TearDown() override {
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  void Write(const std::string& text) {
    ASSERT_TRUE(WriteFileAtomically(path_, text).ok());
  }

  std::string dir_;
  std::string path_;
  FakeClock clock_;
};

TEST_F(DenyListTest, ListedIdentitiesAreDenied) {
  Write(absl::StrCat("# revoked 2026-12-03\n", kWorker3, "\n\n  ", kAlice,
                     "  # left the team\n"));
  auto list = DenyList::Open(path_, &clock_);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ((*list)->size(), 2u);
  EXPECT_TRUE((*list)->Denies(kWorker3));
  EXPECT_TRUE((*list)->Denies(kAlice));
  EXPECT_FALSE((*list)->Denies("spiffe://lockstep/worker/worker/30"));
  EXPECT_FALSE((*list)->Denies("spiffe://lockstep/operator"));
}

TEST_F(DenyListTest, AChangedFileIsReadAgainAfterTheRecheckInterval) {
  Write(absl::StrCat(kAlice, "\n"));
  auto list = DenyList::Open(path_, &clock_);
  ASSERT_TRUE(list.ok()) << list.status();
  Write(absl::StrCat(kWorker3, "\n"));
  // Not looked at again within the interval.
  EXPECT_FALSE((*list)->Denies(kWorker3));
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE((*list)->Denies(kWorker3));
  EXPECT_FALSE((*list)->Denies(kAlice));
}

TEST_F(DenyListTest, ABadVersionKeepsTheLastGoodList) {
  Write(absl::StrCat(kAlice, "\n"));
  auto list = DenyList::Open(path_, &clock_);
  ASSERT_TRUE(list.ok()) << list.status();
  Write("alice\n");  // not a SPIFFE ID
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE((*list)->Denies(kAlice));
  ASSERT_EQ(unlink(path_.c_str()), 0);
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE((*list)->Denies(kAlice));
  // A good version again is taken.
  Write(absl::StrCat(kWorker3, "\n"));
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE((*list)->Denies(kWorker3));
  EXPECT_FALSE((*list)->Denies(kAlice));
}

TEST_F(DenyListTest, AtStartABadFileIsAnErrorNamingItAndTheLine) {
  auto missing = DenyList::Open(path_, &clock_);
  EXPECT_THAT(missing.status().message(),
              AllOf(HasSubstr("--deny-identities"), HasSubstr(path_)));
  Write(absl::StrCat(kAlice, "\nspiffe://lockstep/operator/bob smith\n"));
  auto bad = DenyList::Open(path_, &clock_);
  EXPECT_TRUE(absl::IsFailedPrecondition(bad.status()));
  EXPECT_THAT(bad.status().message(),
              AllOf(HasSubstr(path_), HasSubstr("line 2"),
                    HasSubstr("not a SPIFFE ID")));
  Write(std::string(DenyList::kMaxBytes + 1, '#'));
  EXPECT_THAT(DenyList::Open(path_, &clock_).status().message(),
              HasSubstr("at most"));
  EXPECT_FALSE(DenyList::Open(dir_, &clock_).ok());  // a folder
}

}  // namespace
}  // namespace lockstep
