#include "common/copy.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace rdmabuf {
namespace {

bool short_string_move_is_fast() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (edx & (1u << 4)) != 0;  // FSRM
#else
  return false;
#endif
}

}  // namespace

const bool kShortStringMoveIsFast = short_string_move_is_fast();

}  // namespace rdmabuf
