// Checks rdmabuf's own CUDA declarations (common/cuda_api.h) against the
// toolkit's cuda.h, at compile time: every constant has cuda.h's value,
// every entry point's exported symbol is what cuda.h's name expands to, and
// every signature is ABI-compatible with cuda.h's (same number of
// parameters; each, and the result, of the same size, alignment and
// category: pointer, integer or enum, struct). Compiled only where cuda.h is
// found (CMakeLists.txt, RDMABUF_CUDA_CHECK); nothing links it.
#include <cstring>
#include <type_traits>

#include "common/cuda_api.h"

// Our values, taken before cuda.h defines some of the same names as macros.
namespace saved {
using namespace rdmabuf::cuda;
#define RDMABUF_SAVE(name, type, value) constexpr type name##_value = name;
RDMABUF_CUDA_CONSTANTS(RDMABUF_SAVE)
#undef RDMABUF_SAVE
}  // namespace saved

#include <cuda.h>

namespace {

// Pointer, integral (or enum), or class: what the calling convention cares about.
template <class T>
constexpr int category() {
  if constexpr (std::is_pointer_v<T>) return 0;
  if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) return 1;
  if constexpr (std::is_class_v<T>) return 2;
  return 3;
}

template <class A, class B>
constexpr bool same_abi();

// What two pointers point to: both opaque structs (handles such as
// CUctx_st*, which may be incomplete), both void, or the same in size,
// alignment and category (size_t* is not int*).
template <class A, class B>
constexpr bool same_pointee() {
  if constexpr (std::is_class_v<A> || std::is_class_v<B>) {
    return std::is_class_v<A> && std::is_class_v<B>;
  } else if constexpr (std::is_void_v<A> || std::is_void_v<B>) {
    return std::is_void_v<A> && std::is_void_v<B>;
  } else {
    return same_abi<A, B>();
  }
}

template <class A, class B>
constexpr bool same_abi() {
  if constexpr (std::is_pointer_v<A> && std::is_pointer_v<B>) {
    return same_pointee<std::remove_cv_t<std::remove_pointer_t<A>>,
                        std::remove_cv_t<std::remove_pointer_t<B>>>();
  } else {
    return sizeof(A) == sizeof(B) && alignof(A) == alignof(B) && category<A>() == category<B>();
  }
}

template <class Ours, class Theirs>
struct Compatible : std::false_type {};
template <class R1, class... A1, class R2, class... A2>
struct Compatible<R1(A1...), R2(A2...)> {
  static constexpr bool value = [] {
    if constexpr (sizeof...(A1) != sizeof...(A2)) {
      return false;
    } else {
      return same_abi<R1, R2>() && (same_abi<A1, A2>() && ...);
    }
  }();
};

constexpr bool same_text(const char* a, const char* b) {
  while (*a && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}

#define RDMABUF_TEXT(x) #x
#define RDMABUF_EXPANDED_TEXT(x) RDMABUF_TEXT(x)

// `name` is expanded by cuda.h's macros here (cuMemAlloc -> cuMemAlloc_v2).
#define RDMABUF_CHECK_ENTRY(name, symbol, ret, params)                                    \
  static_assert(same_text(RDMABUF_EXPANDED_TEXT(name), #symbol),                          \
                "cuda_api.h: the symbol of " #name " is not what cuda.h exports");        \
  static_assert(                                                                          \
      Compatible<rdmabuf::cuda::name##_t, std::remove_pointer_t<decltype(&name)>>::value, \
      "cuda_api.h: the signature of " #name " does not match cuda.h");
RDMABUF_CUDA_ENTRY_POINTS(RDMABUF_CHECK_ENTRY)

#define RDMABUF_CHECK_CONSTANT(name, type, value)               \
  static_assert(saved::name##_value == static_cast<type>(name), \
                "cuda_api.h: the value of " #name " is not cuda.h's");
RDMABUF_CUDA_CONSTANTS(RDMABUF_CHECK_CONSTANT)

static_assert(sizeof(rdmabuf::cuda::CUipcMemHandle) == sizeof(CUipcMemHandle));
static_assert(sizeof(rdmabuf::cuda::CUdeviceptr) == sizeof(CUdeviceptr));
static_assert(std::is_same_v<rdmabuf::cuda::CUdeviceptr, CUdeviceptr>);
static_assert(sizeof(rdmabuf::cuda::CUresult) == sizeof(CUresult));
static_assert(sizeof(rdmabuf::cuda::CUdevice) == sizeof(CUdevice));

}  // namespace
