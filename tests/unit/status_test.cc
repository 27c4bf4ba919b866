// Status and Result<T> (include/rdmabuf/status.h).
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>

#include "rdmabuf/status.h"
#include "tests/helpers/printers.h"

namespace rdmabuf {
namespace {

constexpr StatusCode kAllCodes[] = {
    StatusCode::kOk,
    StatusCode::kInvalidArgument,
    StatusCode::kNotFound,
    StatusCode::kPermissionDenied,
    StatusCode::kDeadlineExceeded,
    StatusCode::kCancelled,
    StatusCode::kUnavailable,
    StatusCode::kProtocolError,
    StatusCode::kFailedPrecondition,
    StatusCode::kResourceExhausted,
    StatusCode::kUnimplemented,
    StatusCode::kInternal,
};

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.to_string(), "OK");
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status(), Status::Ok());
}

TEST(StatusTest, OkCodeWithMessageIsStillOk) {
  Status s(StatusCode::kOk, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.message(), "");
}

TEST(StatusTest, CodeNamesAreDistinctAndStable) {
  std::set<std::string> names;
  for (StatusCode code : kAllCodes) {
    std::string name(status_code_name(code));
    EXPECT_FALSE(name.empty());
    EXPECT_NE(name, "Unknown");
    names.insert(name);
  }
  EXPECT_EQ(names.size(), std::size(kAllCodes));
  EXPECT_EQ(status_code_name(StatusCode::kNotFound), "NotFound");
  EXPECT_EQ(status_code_name(StatusCode::kInvalidArgument), "InvalidArgument");
  EXPECT_EQ(status_code_name(StatusCode::kResourceExhausted), "ResourceExhausted");
  EXPECT_EQ(status_code_name(static_cast<StatusCode>(200)), "Unknown");
}

TEST(StatusTest, HelpersBuildTheirCode) {
  EXPECT_EQ(InvalidArgument("m").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NotFound("m").code(), StatusCode::kNotFound);
  EXPECT_EQ(PermissionDenied("m").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(DeadlineExceeded("m").code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Cancelled("m").code(), StatusCode::kCancelled);
  EXPECT_EQ(Unavailable("m").code(), StatusCode::kUnavailable);
  EXPECT_EQ(ProtocolError("m").code(), StatusCode::kProtocolError);
  EXPECT_EQ(FailedPrecondition("m").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ResourceExhausted("m").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(Unimplemented("m").code(), StatusCode::kUnimplemented);
  EXPECT_EQ(Internal("m").code(), StatusCode::kInternal);
  for (StatusCode code : kAllCodes) {
    Status s(code, "msg");
    EXPECT_EQ(s.ok(), code == StatusCode::kOk);
  }
}

TEST(StatusTest, ToStringAndContext) {
  Status s = NotFound("buffer 7 is gone");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "buffer 7 is gone");
  EXPECT_EQ(s.to_string(), "NotFound: buffer 7 is gone");
  Status c = s.with_context("read of 4 KiB");
  EXPECT_EQ(c.code(), StatusCode::kNotFound);
  EXPECT_EQ(c.message(), "read of 4 KiB: buffer 7 is gone");
  EXPECT_EQ(s.message(), "buffer 7 is gone") << "with_context must not modify the original";
  EXPECT_TRUE(Status::Ok().with_context("ctx").ok());
}

TEST(StatusTest, EqualityComparesCodeAndMessage) {
  EXPECT_EQ(NotFound("a"), NotFound("a"));
  EXPECT_FALSE(NotFound("a") == NotFound("b"));
  EXPECT_FALSE(NotFound("a") == InvalidArgument("a"));
  EXPECT_FALSE(NotFound("") == Status::Ok());
}

TEST(StatusTest, CopiesShareNothingObservable) {
  Status a = Unavailable("x");
  Status b = a;
  a = Status::Ok();
  EXPECT_TRUE(a.ok());
  EXPECT_EQ(b.code(), StatusCode::kUnavailable);
  EXPECT_EQ(b.message(), "x");
}

TEST(StatusTest, Retryable) {
  std::set<StatusCode> retryable;
  for (StatusCode code : kAllCodes)
    if (is_retryable(code)) retryable.insert(code);
  EXPECT_EQ(retryable, (std::set<StatusCode>{StatusCode::kUnavailable, StatusCode::kProtocolError,
                                             StatusCode::kDeadlineExceeded}));
}

TEST(ResultTest, HoldsAValue) {
  Result<int> r(42);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.status().ok());
  EXPECT_EQ(r.value(), 42);
  EXPECT_EQ(*r, 42);
  *r = 43;
  EXPECT_EQ(r.value(), 43);
}

TEST(ResultTest, HoldsAnError) {
  Result<std::string> r(NotFound("nope"));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "nope");
}

TEST(ResultTest, MoveOnlyValues) {
  Result<std::unique_ptr<int>> r(std::make_unique<int>(5));
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 5);
}

TEST(ResultTest, ArrowOperator) {
  Result<std::string> r(std::string("hello"));
  EXPECT_EQ(r->size(), 5u);
}

#ifdef NDEBUG
// In debug builds this asserts (a bug in the caller); in release builds it
// must still not produce an OK Result without a value.
TEST(ResultTest, BuiltFromOkStatusBecomesInternal) {
  Result<int> r{Status::Ok()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}
#endif

Status fails_with(StatusCode code) {
  return Status(code, "inner");
}

Status use_return_if_error(StatusCode code, bool* reached_end) {
  RDMABUF_RETURN_IF_ERROR(fails_with(code));
  *reached_end = true;
  return Status::Ok();
}

Result<int> produce(bool ok) {
  if (!ok) return Unavailable("no value");
  return 7;
}

Result<int> use_assign_or_return(bool ok) {
  RDMABUF_ASSIGN_OR_RETURN(int v, produce(ok));
  RDMABUF_ASSIGN_OR_RETURN(int w, produce(ok));  // two on one function: distinct temporaries
  return v + w;
}

TEST(StatusMacrosTest, ReturnIfError) {
  bool reached = false;
  Status s = use_return_if_error(StatusCode::kNotFound, &reached);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_FALSE(reached);
  EXPECT_TRUE(use_return_if_error(StatusCode::kOk, &reached).ok());
  EXPECT_TRUE(reached);
}

TEST(StatusMacrosTest, AssignOrReturn) {
  auto good = use_assign_or_return(true);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 14);
  auto bad = use_assign_or_return(false);
  EXPECT_EQ(bad.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace rdmabuf
