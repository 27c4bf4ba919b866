// "[ 3/12] what is running now" on stderr for the long commands (bench):
// one line rewritten in place on a terminal, one line per step otherwise,
// nothing at all when quiet.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

namespace rdmabuf::tool {

class Progress {
 public:
  explicit Progress(int total, bool quiet = false)
      : total_(total), tty_(isatty(STDERR_FILENO)), quiet_(quiet) {}
  void step(const std::string& what) {
    ++done_;
    if (quiet_) return;
    std::fprintf(stderr, "%s[%2d/%d] %-60s%s", tty_ ? "\r" : "", done_, total_, what.c_str(),
                 tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  // Clears the line before something else is printed.
  void finish() {
    if (tty_ && !quiet_) std::fprintf(stderr, "\r%80s\r", "");
  }

 private:
  int total_;
  int done_ = 0;
  bool tty_;
  bool quiet_;
};

}  // namespace rdmabuf::tool
