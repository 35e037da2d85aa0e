// Text from the network made safe to print on a terminal (docs/DESIGN.md
// §1): a worker's host name, a job's error or an event could otherwise
// carry escape sequences that move the cursor, recolour or retitle the
// terminal of whoever runs `lockstep status`.
#ifndef LOCKSTEP_COMMON_TERMINAL_TEXT_H_
#define LOCKSTEP_COMMON_TERMINAL_TEXT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace lockstep {

// `text` with every control character but tab and newline (C0 and DEL)
// shown as \xNN. Other bytes, UTF-8 included, are kept.
std::string TerminalSafe(absl::string_view text);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_TERMINAL_TEXT_H_
