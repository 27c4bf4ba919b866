// Command-line parsing for the rdmabuf tool: positionals, `--name value`
// options and `--flag`s, with errors that say what is wrong.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "rdmabuf/status.h"

namespace rdmabuf::tool {

struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;  // without the leading "--"
  std::set<std::string> flags;

  bool has(const std::string& name) const { return options.count(name) || flags.count(name); }
  std::optional<std::string> get(const std::string& name) const;
  // A size option ("4096", "64K", "1M"); `fallback` when absent.
  Result<uint64_t> size(const std::string& name, uint64_t fallback) const;
  // A comma-separated list of sizes > 0 ("4K,64K,1M"); `fallback` (the
  // same form) when absent. kInvalidArgument for a bad or empty list.
  Result<std::vector<uint64_t>> size_list(const std::string& name,
                                          const std::string& fallback) const;
  // An integer option in [min, max]; `fallback` when absent.
  Result<int64_t> integer(const std::string& name, int64_t fallback, int64_t min,
                          int64_t max) const;
};

// Parses argv[first..]. `with_value` names options that take a value,
// `flags` those that do not; anything else starting with "--" is an error.
Result<Args> parse_args(int argc, char** argv, int first, const std::set<std::string>& with_value,
                        const std::set<std::string>& flags);

// Exit codes of the tool.
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;  // the operation failed (message on stderr)
constexpr int kExitUsage = 2;   // bad command line

// Prints "rdmabuf: <status>" to stderr and returns kExitUsage for
// kInvalidArgument, kExitFailed otherwise.
int fail(const Status& status);

// True when argv[first..] holds "--help" or "-h", wherever it stands. A
// command checks this before parsing anything else, so that its help
// prints (and exits 0) even beside options it would refuse.
bool wants_help(int argc, char** argv, int first = 2);

// Writes a command's help text to stdout; returns kExitOk.
int print_help(const char* text);

}  // namespace rdmabuf::tool
