// Allocation: host memory from LocalMemory::allocate, exported to Python
// through the buffer protocol; rdmabuf.empty (rdmabuf/_empty.py) views it
// as a torch tensor or numpy array.
#include "python/src/binding.h"

namespace rdmabuf::python {
namespace {

// Owns one allocation. Every buffer export of it (a memoryview, an array
// from numpy.frombuffer, a tensor from torch.frombuffer) holds a reference
// to this object, so the memory stays mapped while any view of it lives and
// is freed (unmapped, its memfd closed) when the last one goes. A manager
// that registered the memory finds its file by address (LocalMemory's
// allocate), not through this object.
class PyAllocation {
 public:
  explicit PyAllocation(LocalMemory memory) : memory_(std::move(memory)) {}

  size_t size() const { return memory_.size(); }

  // One-dimensional, unsigned bytes ('B'), writable.
  py::buffer_info buffer() const {
    return py::buffer_info(memory_.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(memory_.size())}, {py::ssize_t{1}},
                           /*readonly=*/false);
  }

 private:
  LocalMemory memory_;
};

}  // namespace

void bind_allocation(py::module_& m) {
  py::class_<PyAllocation>(m, "Allocation", py::buffer_protocol())
      .def_buffer(&PyAllocation::buffer)
      .def_property_readonly("size", &PyAllocation::size);
  m.def(
      "allocate",
      [](uint64_t nbytes) {
        Result<LocalMemory> memory = LocalMemory::allocate(nbytes);
        if (!memory.ok()) raise_status(memory.status());
        return PyAllocation(std::move(memory).value());
      },
      "LocalMemory::allocate(nbytes): zero-filled, page-aligned host memory in a shared file.");
}

}  // namespace rdmabuf::python
