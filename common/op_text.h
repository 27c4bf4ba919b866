#pragma once

#include <string>

#include "rdmabuf/op.h"

namespace rdmabuf {

// "read of 4 KiB from buffer 7 [0, 4096) of manager … (pid … at …)": the
// subject of every message about one op.
std::string describe_op(const Op& op);

}  // namespace rdmabuf
