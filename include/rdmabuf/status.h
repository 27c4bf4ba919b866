// Status and Result<T>: how every fallible rdmabuf call reports failure.
//
// rdmabuf never throws. A call that can fail returns a Status (or a Result<T>
// holding either a value or a non-OK Status). Codes are grouped by what is
// broken, and each says whether retrying can help:
//
//   the caller's arguments   kInvalidArgument                      retry: no
//   the buffer or the op     kNotFound, kPermissionDenied,          retry: no
//                            kDeadlineExceeded, kCancelled          retry: maybe (see below)
//   the connection to a peer kUnavailable, kProtocolError          retry: yes
//   the backend / the setup  kFailedPrecondition, kResourceExhausted,
//                            kUnimplemented, kInternal             retry: no (fix setup)
//
// Messages name the peer, the buffer and the cause, e.g.
//   "read of buffer 7 (4096 B) from 127.0.0.1:41234: buffer was released by its owner".
#pragma once

#include <cassert>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace rdmabuf {

enum class StatusCode : uint8_t {
  kOk = 0,
  // A range out of bounds, sizes that do not fit, a malformed handle, a bad
  // configuration value. Nothing was transferred. Retrying the same call fails again.
  kInvalidArgument = 1,
  // The buffer is unknown to its owner: released, or its owner restarted.
  // Retrying fails again; get a fresh handle.
  kNotFound = 2,
  // The handle's capability token does not match the buffer (forged or altered).
  kPermissionDenied = 3,
  // The op did not finish before its deadline. The local memory is no longer
  // touched by the library. The remote range of a write is in an unspecified
  // state. Retrying with a longer timeout may help.
  kDeadlineExceeded = 4,
  // The op was cancelled by the caller or by the manager shutting down.
  kCancelled = 5,
  // The peer could not be reached or the connection to it broke mid-op.
  // A retry opens a new connection and may succeed once the peer is back.
  kUnavailable = 6,
  // The peer sent bytes that violate the wire protocol; the connection was
  // dropped. A retry opens a new connection.
  kProtocolError = 7,
  // No usable transport (for example TCP would be needed but fallback is
  // disabled), or the manager is shut down. Change the configuration.
  kFailedPrecondition = 8,
  // A limit was reached (connections, sizes, memory).
  kResourceExhausted = 9,
  kUnimplemented = 10,
  // A bug in rdmabuf or a failing system call that should not fail.
  kInternal = 11,
};

// The stable name of a code, e.g. "NotFound".
std::string_view status_code_name(StatusCode code);

// True for codes where retrying the same call can succeed (kUnavailable,
// kProtocolError, kDeadlineExceeded).
bool is_retryable(StatusCode code);

class [[nodiscard]] Status {
 public:
  // OK.
  Status() = default;
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // Empty for OK.
  const std::string& message() const;
  // "NotFound: <message>", or "OK".
  std::string to_string() const;

  // Returns a copy whose message is "<context>: <message>"; OK stays OK.
  Status with_context(std::string_view context) const;

  // Explicitly ignore a status (for best-effort calls).
  void ignore() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  // Null when OK: an OK status costs one pointer and no allocation.
  std::shared_ptr<const Rep> rep_;
};

// Helpers that build a Status of one code.
Status InvalidArgument(std::string message);
Status NotFound(std::string message);
Status PermissionDenied(std::string message);
Status DeadlineExceeded(std::string message);
Status Cancelled(std::string message);
Status Unavailable(std::string message);
Status ProtocolError(std::string message);
Status FailedPrecondition(std::string message);
Status ResourceExhausted(std::string message);
Status Unimplemented(std::string message);
Status Internal(std::string message);

// Either a T or a non-OK Status. Accessing value() of an error is a bug
// (asserts in debug builds).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    assert(!status_.ok() && "Result built from an OK status without a value");
    if (status_.ok()) status_ = Status(StatusCode::kInternal, "Result built from an OK status");
  }

  bool ok() const { return value_.has_value(); }
  // OK when a value is held.
  const Status& status() const { return status_; }

  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace rdmabuf

// Internal convenience: return the status from the enclosing function when not OK.
#define RDMABUF_RETURN_IF_ERROR(expr)          \
  do {                                         \
    ::rdmabuf::Status _rdmabuf_st = (expr);    \
    if (!_rdmabuf_st.ok()) return _rdmabuf_st; \
  } while (0)

#define RDMABUF_CONCAT_INNER(a, b) a##b
#define RDMABUF_CONCAT(a, b) RDMABUF_CONCAT_INNER(a, b)
// RDMABUF_ASSIGN_OR_RETURN(auto x, expr): x = expr.value(), or return its status.
#define RDMABUF_ASSIGN_OR_RETURN(lhs, expr) \
  RDMABUF_ASSIGN_OR_RETURN_IMPL(RDMABUF_CONCAT(_rdmabuf_res_, __LINE__), lhs, expr)
#define RDMABUF_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
