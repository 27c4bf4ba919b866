#include "common/op_text.h"

#include "common/strings.h"

namespace rdmabuf {

std::string describe_op(const Op& op) {
  std::string out = op_kind_name(op.kind);
  if (op.is_atomic()) {
    out += " on ";
  } else {
    out += " of ";
    out += format_bytes(op.bytes());
    if (op.ranges) out += " in " + std::to_string(op.ranges->size()) + " ranges";
    out += op.kind == OpKind::kReadIntoLocal ? " from " : " to ";
  }
  out += op.remote.describe();
  return out;
}

}  // namespace rdmabuf
