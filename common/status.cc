#include "rdmabuf/status.h"

namespace rdmabuf {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kPermissionDenied:
      return "PermissionDenied";
    case StatusCode::kDeadlineExceeded:
      return "DeadlineExceeded";
    case StatusCode::kCancelled:
      return "Cancelled";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kProtocolError:
      return "ProtocolError";
    case StatusCode::kFailedPrecondition:
      return "FailedPrecondition";
    case StatusCode::kResourceExhausted:
      return "ResourceExhausted";
    case StatusCode::kUnimplemented:
      return "Unimplemented";
    case StatusCode::kInternal:
      return "Internal";
  }
  return "Unknown";
}

bool is_retryable(StatusCode code) {
  return code == StatusCode::kUnavailable || code == StatusCode::kProtocolError ||
         code == StatusCode::kDeadlineExceeded;
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) rep_ = std::make_shared<const Rep>(Rep{code, std::move(message)});
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  std::string out(status_code_name(code()));
  out += ": ";
  out += message();
  return out;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message();
  return Status(code(), std::move(msg));
}

Status InvalidArgument(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
Status NotFound(std::string m) {
  return Status(StatusCode::kNotFound, std::move(m));
}
Status PermissionDenied(std::string m) {
  return Status(StatusCode::kPermissionDenied, std::move(m));
}
Status DeadlineExceeded(std::string m) {
  return Status(StatusCode::kDeadlineExceeded, std::move(m));
}
Status Cancelled(std::string m) {
  return Status(StatusCode::kCancelled, std::move(m));
}
Status Unavailable(std::string m) {
  return Status(StatusCode::kUnavailable, std::move(m));
}
Status ProtocolError(std::string m) {
  return Status(StatusCode::kProtocolError, std::move(m));
}
Status FailedPrecondition(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}
Status ResourceExhausted(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
Status Unimplemented(std::string m) {
  return Status(StatusCode::kUnimplemented, std::move(m));
}
Status Internal(std::string m) {
  return Status(StatusCode::kInternal, std::move(m));
}

}  // namespace rdmabuf
