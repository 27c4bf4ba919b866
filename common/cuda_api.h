// rdmabuf's own declarations of the CUDA driver API it uses: the types, the
// constants and each entry point's signature, with the exact symbol the
// driver library exports for it. rdmabuf needs no CUDA toolkit to build: the
// driver (libcuda.so.1) is loaded at run time (common/cuda_driver.h). Where
// the toolkit is installed, the build checks every declaration here against
// its cuda.h (common/cuda_api_check.cc), so a mistake fails the build there.
//
// The test driver (tests/fake_cuda/) implements the same entry points.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rdmabuf::cuda {

using CUresult = int;  // cuda.h: enum cudaError_enum
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // NOLINT(google-runtime-int): as cuda.h
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;
constexpr size_t kIpcHandleBytes = 64;
struct CUipcMemHandle {
  char reserved[kIpcHandleBytes];
};

// Each constant: X(name in cuda.h, type, value).
#define RDMABUF_CUDA_CONSTANTS(X)                           \
  X(CUDA_SUCCESS, CUresult, 0)                              \
  X(CUDA_ERROR_INVALID_VALUE, CUresult, 1)                  \
  X(CUDA_ERROR_OUT_OF_MEMORY, CUresult, 2)                  \
  X(CUDA_ERROR_NOT_INITIALIZED, CUresult, 3)                \
  X(CUDA_ERROR_DEINITIALIZED, CUresult, 4)                  \
  X(CUDA_ERROR_NO_DEVICE, CUresult, 100)                    \
  X(CUDA_ERROR_INVALID_DEVICE, CUresult, 101)               \
  X(CUDA_ERROR_INVALID_CONTEXT, CUresult, 201)              \
  X(CUDA_ERROR_MAP_FAILED, CUresult, 205)                   \
  X(CUDA_ERROR_ALREADY_MAPPED, CUresult, 208)               \
  X(CUDA_ERROR_INVALID_HANDLE, CUresult, 400)               \
  X(CUDA_ERROR_ILLEGAL_ADDRESS, CUresult, 700)              \
  X(CUDA_ERROR_NOT_SUPPORTED, CUresult, 801)                \
  /* CUpointer_attribute */                                 \
  X(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, int, 2)               \
  X(CU_POINTER_ATTRIBUTE_BUFFER_ID, int, 7)                 \
  X(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, int, 9)            \
  X(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, int, 11)         \
  X(CU_POINTER_ATTRIBUTE_RANGE_SIZE, int, 12)               \
  /* CUmemorytype */                                        \
  X(CU_MEMORYTYPE_HOST, unsigned, 1)                        \
  X(CU_MEMORYTYPE_DEVICE, unsigned, 2)                      \
  X(CU_MEMORYTYPE_UNIFIED, unsigned, 4)                     \
  /* CUmemRangeHandleType */                                \
  X(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, int, 1)            \
  /* CUipcMem_flags */                                      \
  X(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, unsigned, 1)        \
  /* CUstream_flags, CUevent_flags, cuMemHostAlloc flags */ \
  X(CU_STREAM_NON_BLOCKING, unsigned, 1)                    \
  X(CU_EVENT_DISABLE_TIMING, unsigned, 2)                   \
  X(CU_MEMHOSTALLOC_PORTABLE, unsigned, 1)

#define RDMABUF_CUDA_DEFINE_CONSTANT(name, type, value) constexpr type name = value;
RDMABUF_CUDA_CONSTANTS(RDMABUF_CUDA_DEFINE_CONSTANT)
#undef RDMABUF_CUDA_DEFINE_CONSTANT

// Each entry point: X(name in cuda.h, exported symbol, return, parameters).
// The exported symbol is what cuda.h's name expands to (its _v2 and so on);
// `name_t` below is the function's type.
#define RDMABUF_CUDA_ENTRY_POINTS(X)                                                             \
  X(cuInit, cuInit, CUresult, (unsigned flags))                                                  \
  X(cuDriverGetVersion, cuDriverGetVersion, CUresult, (int* version))                            \
  X(cuGetErrorName, cuGetErrorName, CUresult, (CUresult error, const char** name))               \
  X(cuGetErrorString, cuGetErrorString, CUresult, (CUresult error, const char** text))           \
  X(cuDeviceGetCount, cuDeviceGetCount, CUresult, (int* count))                                  \
  X(cuDeviceGet, cuDeviceGet, CUresult, (CUdevice * device, int ordinal))                        \
  X(cuDeviceGetName, cuDeviceGetName, CUresult, (char* name, int length, CUdevice device))       \
  X(cuDeviceTotalMem, cuDeviceTotalMem_v2, CUresult, (size_t * bytes, CUdevice device))          \
  X(cuDeviceGetPCIBusId, cuDeviceGetPCIBusId, CUresult, (char* id, int length, CUdevice device)) \
  X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, CUresult,                                \
    (CUcontext * context, CUdevice device))                                                      \
  X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, CUresult, (CUdevice device))        \
  X(cuCtxSetCurrent, cuCtxSetCurrent, CUresult, (CUcontext context))                             \
  X(cuPointerGetAttribute, cuPointerGetAttribute, CUresult,                                      \
    (void* data, int attribute, CUdeviceptr pointer))                                            \
  X(cuMemGetAddressRange, cuMemGetAddressRange_v2, CUresult,                                     \
    (CUdeviceptr * base, size_t * size, CUdeviceptr pointer))                                    \
  X(cuMemAlloc, cuMemAlloc_v2, CUresult, (CUdeviceptr * pointer, size_t bytes))                  \
  X(cuMemFree, cuMemFree_v2, CUresult, (CUdeviceptr pointer))                                    \
  X(cuMemHostAlloc, cuMemHostAlloc, CUresult, (void** pointer, size_t bytes, unsigned flags))    \
  X(cuMemFreeHost, cuMemFreeHost, CUresult, (void* pointer))                                     \
  X(cuMemcpy, cuMemcpy, CUresult, (CUdeviceptr to, CUdeviceptr from, size_t bytes))              \
  X(cuMemcpyAsync, cuMemcpyAsync, CUresult,                                                      \
    (CUdeviceptr to, CUdeviceptr from, size_t bytes, CUstream stream))                           \
  X(cuMemsetD8, cuMemsetD8_v2, CUresult, (CUdeviceptr to, unsigned char value, size_t bytes))    \
  X(cuStreamCreate, cuStreamCreate, CUresult, (CUstream * stream, unsigned flags))               \
  X(cuStreamDestroy, cuStreamDestroy_v2, CUresult, (CUstream stream))                            \
  X(cuStreamSynchronize, cuStreamSynchronize, CUresult, (CUstream stream))                       \
  X(cuEventCreate, cuEventCreate, CUresult, (CUevent * event, unsigned flags))                   \
  X(cuEventDestroy, cuEventDestroy_v2, CUresult, (CUevent event))                                \
  X(cuEventRecord, cuEventRecord, CUresult, (CUevent event, CUstream stream))                    \
  X(cuEventSynchronize, cuEventSynchronize, CUresult, (CUevent event))                           \
  X(cuIpcGetMemHandle, cuIpcGetMemHandle, CUresult,                                              \
    (CUipcMemHandle * handle, CUdeviceptr pointer))                                              \
  X(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2, CUresult,                                         \
    (CUdeviceptr * pointer, CUipcMemHandle handle, unsigned flags))                              \
  X(cuIpcCloseMemHandle, cuIpcCloseMemHandle, CUresult, (CUdeviceptr pointer))                   \
  X(cuMemGetHandleForAddressRange, cuMemGetHandleForAddressRange, CUresult,                      \
    (void* handle, CUdeviceptr pointer, size_t bytes, int type, unsigned long long flags))

#define RDMABUF_CUDA_FUNCTION_TYPE(name, symbol, ret, params) using name##_t = ret params;
RDMABUF_CUDA_ENTRY_POINTS(RDMABUF_CUDA_FUNCTION_TYPE)
#undef RDMABUF_CUDA_FUNCTION_TYPE

}  // namespace rdmabuf::cuda
