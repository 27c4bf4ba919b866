// How GoogleTest prints rdmabuf values in failure messages ("NotFound"
// rather than "1-byte object <02>").
#pragma once

#include <ostream>

#include "rdmabuf/status.h"

namespace rdmabuf {

inline void PrintTo(StatusCode code, std::ostream* os) {
  *os << status_code_name(code);
}

inline void PrintTo(const Status& status, std::ostream* os) {
  *os << status.to_string();
}

}  // namespace rdmabuf
