"""GPU arrays for the Python tests, on whichever CUDA driver rdmabuf uses.

On CI that is the test driver (tests/fake_cuda, named by
RDMABUF_TEST_CUDA_DRIVER): its GPU memory faults on any host access, so a
code path that reads a GPU array with the CPU crashes the test. With
RDMABUF_TEST_REAL_GPU=1 it is the real libcuda.so.1.

`CudaArray` offers __cuda_array_interface__ (as CuPy and Numba arrays do);
`DlpackArray` offers only DLPack (as JAX arrays may). Both own a cuMemAlloc
allocation, made through ctypes calls into the same driver library.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Optional, Tuple

# The driver rdmabuf will load: set before rdmabuf first touches GPU memory.
if os.environ.get("RDMABUF_TEST_REAL_GPU") != "1" and os.environ.get("RDMABUF_TEST_CUDA_DRIVER"):
    os.environ["RDMABUF_CUDA_DRIVER"] = os.environ["RDMABUF_TEST_CUDA_DRIVER"]
DRIVER_PATH = os.environ.get("RDMABUF_CUDA_DRIVER", "libcuda.so.1")


class Driver:
    """The few driver calls the tests make themselves."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL(DRIVER_PATH)
        self._check(self.lib.cuInit(0), "cuInit")
        self.context = ctypes.c_void_p()
        self._check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), 0), "retain")

    @staticmethod
    def _check(result: int, what: str) -> None:
        if result != 0:
            raise RuntimeError(f"{what}: CUDA error {result}")

    def _current(self) -> None:
        self._check(self.lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def alloc(self, size: int) -> int:
        self._current()
        pointer = ctypes.c_uint64()
        self._check(self.lib.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)), "alloc")
        return pointer.value

    def free(self, pointer: int) -> None:
        self._current()
        self.lib.cuMemFree_v2(ctypes.c_uint64(pointer))

    def upload(self, pointer: int, data: bytes) -> None:
        self._current()
        src = ctypes.create_string_buffer(data, len(data))
        self._check(
            self.lib.cuMemcpy(
                ctypes.c_uint64(pointer),
                ctypes.c_uint64(ctypes.addressof(src)),
                ctypes.c_size_t(len(data)),
            ),
            "cuMemcpy to the GPU",
        )

    def download(self, pointer: int, size: int) -> bytes:
        self._current()
        dst = ctypes.create_string_buffer(size)
        self._check(
            self.lib.cuMemcpy(
                ctypes.c_uint64(ctypes.addressof(dst)), ctypes.c_uint64(pointer), ctypes.c_size_t(size)
            ),
            "cuMemcpy from the GPU",
        )
        return dst.raw


_driver: Optional[Driver] = None


def driver() -> Driver:
    global _driver
    if _driver is None:
        _driver = Driver()
    return _driver


class CudaArray:
    """`size` bytes on GPU 0, as uint8, with __cuda_array_interface__ (v3)."""

    def __init__(self, data: bytes, readonly: bool = False, stream: Optional[int] = None) -> None:
        self.size = len(data)
        self.pointer = driver().alloc(max(self.size, 1))
        driver().upload(self.pointer, data)
        self.readonly = readonly
        self.stream = stream

    def __del__(self) -> None:
        if _driver is not None:
            _driver.free(self.pointer)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "data": (self.pointer, self.readonly),
            "shape": (self.size,),
            "typestr": "|u1",
            "strides": None,
            "version": 3,
            "stream": self.stream,
        }

    def bytes(self) -> bytes:
        return driver().download(self.pointer, self.size)


# --- DLPack, built with ctypes as a producer would ---------------------------


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
]

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DlpackArray(CudaArray):
    """A CudaArray that offers DLPack only. `deleted` counts its deleter's calls."""

    def __init__(self, data: bytes, shape: Tuple[int, ...] = ()) -> None:
        super().__init__(data)
        self._shape_values = shape or (self.size,)
        self.deleted = 0
        self.streams_asked: list = []
        self._keep: list = []

    @property
    def __cuda_array_interface__(self) -> Any:  # type: ignore[override]
        raise AttributeError("DLPack only")

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (2, 0)  # kDLCUDA, GPU 0

    def __dlpack__(self, stream: Any = None) -> Any:
        self.streams_asked.append(stream)
        shape = (ctypes.c_int64 * len(self._shape_values))(*self._shape_values)
        managed = _DLManagedTensor()
        managed.dl_tensor.data = self.pointer
        managed.dl_tensor.device = _DLDevice(2, 0)
        managed.dl_tensor.ndim = len(self._shape_values)
        managed.dl_tensor.dtype = _DLDataType(1, 8, 1)  # uint8
        managed.dl_tensor.shape = shape
        managed.dl_tensor.strides = None
        managed.dl_tensor.byte_offset = 0

        def deleter(_: Any) -> None:
            self.deleted += 1

        callback = _Deleter(deleter)
        managed.deleter = callback
        self._keep += [shape, managed, callback]
        return _PyCapsule_New(ctypes.addressof(managed), b"dltensor", None)
