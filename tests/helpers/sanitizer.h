// ThreadSanitizer cannot see the happens-before edge that a TCP round trip
// creates between two threads of one process (the owner's server thread
// writes a buffer and sends a reply on one socket; the reader's thread
// receives it on another). Checks that read an owner's memory after a
// remote write completed are wrapped in ScopedIgnoreReads so that TSan does
// not report that edge as a race. Without TSan this does nothing.
#pragma once

extern "C" {
void AnnotateIgnoreReadsBegin(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreReadsEnd(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreWritesBegin(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreWritesEnd(const char* file, int line) __attribute__((weak));
}

namespace rdmabuf::testing {

class ScopedIgnoreReads {
 public:
  ScopedIgnoreReads() {
    if (AnnotateIgnoreReadsBegin) AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
  }
  ~ScopedIgnoreReads() {
    if (AnnotateIgnoreReadsEnd) AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
  ScopedIgnoreReads(const ScopedIgnoreReads&) = delete;
  ScopedIgnoreReads& operator=(const ScopedIgnoreReads&) = delete;
};

class ScopedIgnoreAccesses {
 public:
  ScopedIgnoreAccesses() {
    if (AnnotateIgnoreWritesBegin) AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~ScopedIgnoreAccesses() {
    if (AnnotateIgnoreWritesEnd) AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
  }
  ScopedIgnoreAccesses(const ScopedIgnoreAccesses&) = delete;
  ScopedIgnoreAccesses& operator=(const ScopedIgnoreAccesses&) = delete;

 private:
  ScopedIgnoreReads reads_;
};

}  // namespace rdmabuf::testing
