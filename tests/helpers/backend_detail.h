// A backend's detail as `rdmabuf info` shows it (BackendInfo::details), for
// tests that read a backend's counters.
#pragma once

#include <string>

#include "rdmabuf/manager.h"

namespace rdmabuf::testing {

// The detail `key` of `m`'s backend `backend` ("notices taken", ...), or
// "<no detail ...>" when there is none.
inline std::string backend_detail(const Manager& m, const std::string& backend,
                                  const std::string& key) {
  for (const BackendInfo& info : m.backends()) {
    if (info.name != backend) continue;
    for (const auto& [name, value] : info.details) {
      if (name == key) return value;
    }
  }
  return "<no detail '" + key + "' of " + backend + ">";
}

}  // namespace rdmabuf::testing
