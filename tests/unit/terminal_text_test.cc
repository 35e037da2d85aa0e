// TerminalSafe: nothing printed from the network can drive the terminal.
#include "common/terminal_text.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

TEST(TerminalSafeTest, EscapesControlCharactersAndKeepsTheRest) {
  // A host name that would retitle the terminal and clear the screen.
  EXPECT_EQ(TerminalSafe("evil\x1b]0;pwned\x07\x1b[2J"),
            "evil\\x1b]0;pwned\\x07\\x1b[2J");
  EXPECT_EQ(TerminalSafe("a\rb\x7f"), "a\\x0db\\x7f");
  EXPECT_EQ(TerminalSafe(std::string("nul\0byte", 8)), "nul\\x00byte");
  EXPECT_EQ(TerminalSafe("tab\tand\nnewline"), "tab\tand\nnewline");
  EXPECT_EQ(TerminalSafe("h\xc3\xb6st-1 10.0.0.7"), "h\xc3\xb6st-1 10.0.0.7");
  EXPECT_EQ(TerminalSafe(""), "");
}

}  // namespace
}  // namespace lockstep
