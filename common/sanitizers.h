// Whether this translation unit is built with ThreadSanitizer
// (RDMABUF_UNDER_TSAN), for code that tells it what it cannot see
// (common/futex_mutex.h) or steps around a race that is there by design
// (tools/cmd_serve.cc). GCC says so with __SANITIZE_THREAD__, clang with
// __has_feature(thread_sanitizer). RDMABUF_UNDER_SANITIZER: with any of
// ThreadSanitizer and AddressSanitizer, for code that must not hide its
// memory accesses from them in assembly (common/copy.h).
#pragma once

#if defined(__SANITIZE_THREAD__)
#define RDMABUF_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RDMABUF_UNDER_TSAN 1
#endif
#endif

#if defined(RDMABUF_UNDER_TSAN) || defined(__SANITIZE_ADDRESS__)
#define RDMABUF_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RDMABUF_UNDER_SANITIZER 1
#endif
#endif
