#include "tools/args.h"

#include <cstdio>
#include <cstring>

#include "common/strings.h"
#include "rdmabuf/config.h"

namespace rdmabuf::tool {

std::optional<std::string> Args::get(const std::string& name) const {
  auto it = options.find(name);
  if (it == options.end()) return std::nullopt;
  return it->second;
}

Result<uint64_t> Args::size(const std::string& name, uint64_t fallback) const {
  auto value = get(name);
  if (!value) return fallback;
  auto parsed = parse_size(*value);
  if (!parsed.ok()) return InvalidArgument("--" + name + ": " + parsed.status().message());
  return static_cast<uint64_t>(*parsed);
}

Result<std::vector<uint64_t>> Args::size_list(const std::string& name,
                                              const std::string& fallback) const {
  std::vector<uint64_t> sizes;
  for (const std::string& s : split_list(get(name).value_or(fallback))) {
    auto size = parse_size(s);
    if (!size.ok() || *size == 0) {
      return InvalidArgument("--" + name + ": '" + s + "' is not a size > 0");
    }
    sizes.push_back(*size);
  }
  if (sizes.empty()) return InvalidArgument("--" + name + " is empty");
  return sizes;
}

Result<int64_t> Args::integer(const std::string& name, int64_t fallback, int64_t min,
                              int64_t max) const {
  auto value = get(name);
  if (!value) return fallback;
  auto parsed = parse_int(*value, min, max);
  if (!parsed) {
    return InvalidArgument("--" + name + " '" + *value + "': expected an integer in " +
                           std::to_string(min) + ".." + std::to_string(max));
  }
  return *parsed;
}

Result<Args> parse_args(int argc, char** argv, int first, const std::set<std::string>& with_value,
                        const std::set<std::string>& flags) {
  Args args;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      args.positional.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::optional<std::string> inline_value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (flags.count(name)) {
      if (inline_value) return InvalidArgument("--" + name + " takes no value");
      args.flags.insert(name);
    } else if (with_value.count(name)) {
      if (inline_value) {
        args.options[name] = *inline_value;
      } else if (i + 1 < argc) {
        args.options[name] = argv[++i];
      } else {
        return InvalidArgument("--" + name + " needs a value");
      }
    } else {
      return InvalidArgument("unknown option --" + name);
    }
  }
  return args;
}

bool wants_help(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) return true;
  }
  return false;
}

int print_help(const char* text) {
  std::fputs(text, stdout);
  return kExitOk;
}

int fail(const Status& status) {
  std::fprintf(stderr, "rdmabuf: %s\n", status.to_string().c_str());
  return status.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailed;
}

}  // namespace rdmabuf::tool
