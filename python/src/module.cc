// The module `_rdmabuf`: the compiled layer under the `rdmabuf` package.
// Private: its names and signatures may change; `rdmabuf` is the API (see
// python/rdmabuf/_rdmabuf.pyi for what it exposes).
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <tuple>

#include "python/src/binding.h"

namespace rdmabuf::python {
namespace {

// --- Config <-> dict -------------------------------------------------------------
// Keys are the RDMABUF_* variable names, lower-cased, without the prefix.

py::dict config_to_dict(const Config& c) {
  py::dict d;
  d["listen"] = c.listen_address;
  d["advertise_host"] = c.advertise_host;
  d["backends"] = py::tuple(py::cast(c.backends));
  d["allow_tcp_fallback"] = c.allow_tcp_fallback;
  d["tcp_streams"] = c.tcp_streams;
  d["chunk_size"] = c.chunk_size;
  d["busy_poll_us"] = c.busy_poll.count();
  d["timeout_ms"] = c.default_timeout.count();
  d["io_stall_timeout_ms"] = c.io_stall_timeout.count();
  d["max_connections"] = c.max_connections;
  d["io_threads"] = c.io_threads;
  d["log_level"] = log_level_name(c.log_level);
  return d;
}

[[noreturn]] void bad_type(const std::string& key, const char* expected, py::handle value) {
  throw py::type_error("rdmabuf config field '" + key + "' must be " + expected + ", not " +
                       Py_TYPE(value.ptr())->tp_name);
}

int64_t int_field(const std::string& key, py::handle value) {
  if (PyBool_Check(value.ptr()) || !PyLong_Check(value.ptr())) bad_type(key, "an int", value);
  return value.cast<int64_t>();
}

std::string str_field(const std::string& key, py::handle value) {
  if (!PyUnicode_Check(value.ptr())) bad_type(key, "a str", value);
  return value.cast<std::string>();
}

// Config::from_env() with `overrides` applied, validated.
Config make_config(const py::dict& overrides) {
  auto env = Config::from_env();
  if (!env.ok()) raise_status(env.status());
  Config c = *env;
  for (auto [k, value] : overrides) {
    const std::string key = py::str(k);
    if (key == "listen") {
      c.listen_address = str_field(key, value);
    } else if (key == "advertise_host") {
      c.advertise_host = str_field(key, value);
    } else if (key == "backends") {
      c.backends.clear();
      if (PyUnicode_Check(value.ptr())) {
        std::string text = value.cast<std::string>();
        size_t start = 0;
        while (start <= text.size()) {
          size_t comma = text.find(',', start);
          if (comma == std::string::npos) comma = text.size();
          std::string name = text.substr(start, comma - start);
          name.erase(0, name.find_first_not_of(" \t"));
          name.erase(name.find_last_not_of(" \t") + 1);
          if (!name.empty()) c.backends.push_back(name);
          start = comma + 1;
        }
      } else {
        try {
          for (py::handle item : py::iter(value))
            c.backends.push_back(str_field(key, item));
        } catch (py::error_already_set&) {
          bad_type(key, "a str or an iterable of str", value);
        }
      }
    } else if (key == "allow_tcp_fallback") {
      if (!PyBool_Check(value.ptr())) bad_type(key, "a bool", value);
      c.allow_tcp_fallback = value.cast<bool>();
    } else if (key == "tcp_streams") {
      c.tcp_streams = static_cast<int>(std::clamp<int64_t>(int_field(key, value), -1, 1 << 30));
    } else if (key == "chunk_size") {
      if (PyUnicode_Check(value.ptr())) {
        auto size = parse_size(value.cast<std::string>());
        if (!size.ok()) raise_status(size.status().with_context("chunk_size"));
        c.chunk_size = *size;
      } else {
        const int64_t v = int_field(key, value);
        if (v < 0) raise_code(StatusCode::kInvalidArgument, "chunk_size must be > 0");
        c.chunk_size = static_cast<size_t>(v);
      }
    } else if (key == "busy_poll_us") {
      c.busy_poll = std::chrono::microseconds(int_field(key, value));
    } else if (key == "timeout_ms") {
      c.default_timeout = std::chrono::milliseconds(int_field(key, value));
    } else if (key == "io_stall_timeout_ms") {
      c.io_stall_timeout = std::chrono::milliseconds(int_field(key, value));
    } else if (key == "max_connections") {
      c.max_connections = static_cast<int>(std::clamp<int64_t>(int_field(key, value), -1, 1 << 30));
    } else if (key == "io_threads") {
      c.io_threads = static_cast<int>(std::clamp<int64_t>(int_field(key, value), -1, 1 << 30));
    } else if (key == "log_level") {
      const std::string level = str_field(key, value);
      if (level == "error") {
        c.log_level = LogLevel::kError;
      } else if (level == "warn") {
        c.log_level = LogLevel::kWarn;
      } else if (level == "info") {
        c.log_level = LogLevel::kInfo;
      } else if (level == "debug") {
        c.log_level = LogLevel::kDebug;
      } else {
        raise_code(StatusCode::kInvalidArgument,
                   "log_level must be error, warn, info or debug, not '" + level + "'");
      }
    } else {
      throw py::type_error("rdmabuf has no config field '" + key +
                           "' (fields: listen, advertise_host, backends, allow_tcp_fallback, "
                           "tcp_streams, chunk_size, busy_poll_us, timeout_ms, "
                           "io_stall_timeout_ms, max_connections, io_threads, log_level)");
    }
  }
  Status valid = c.validate();
  if (!valid.ok()) raise_status(valid);
  return c;
}

// --- Handles -------------------------------------------------------------------

py::tuple owner_tuple(const PeerIdentity& p) {
  return py::make_tuple(p.manager_id, p.address, p.host_id, p.pid, p.to_string());
}

RemoteBuffer handle_from_bytes(py::handle data) {
  if (!PyObject_CheckBuffer(data.ptr())) {
    throw py::type_error(std::string("a handle is bytes-like, not ") +
                         Py_TYPE(data.ptr())->tp_name);
  }
  Py_buffer view;
  if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) throw py::error_already_set();
  auto handle = RemoteBuffer::from_bytes(std::span<const uint8_t>(
      static_cast<const uint8_t*>(view.buf), static_cast<size_t>(view.len)));
  PyBuffer_Release(&view);
  if (!handle.ok()) raise_status(handle.status());
  return std::move(handle).value();
}

std::string bytes_text(uint64_t n) {
  return std::to_string(n) + " B";
}

// --- Manager methods -------------------------------------------------------------

std::unique_ptr<PyRegistration> register_data(py::object self, py::handle data) {
  auto& pm = self.cast<PyManager&>();
  Manager& m = pm.get();
  PyLocal local = PyLocal::acquire(data, /*writable=*/true, "RDMABuffer data");
  if (local.size() == 0) {
    raise_code(StatusCode::kInvalidArgument, "cannot create an RDMABuffer of 0 bytes");
  }
  auto handle = m.register_buffer(local.memory());
  if (!handle.ok()) raise_status(handle.status());
  return std::make_unique<PyRegistration>(std::move(self), std::move(handle).value(),
                                          std::move(local));
}

std::unique_ptr<PyTransfer> read_into(py::object self, const RemoteBuffer& remote, py::handle dst,
                                      std::optional<double> timeout, bool notify) {
  auto& pm = self.cast<PyManager&>();
  Manager& m = pm.get();
  check_handle(remote);
  const auto ms = pm.timeout_ms(timeout);
  PyLocal local = PyLocal::acquire(dst, /*writable=*/true, "read_into: dst", /*strided=*/true);
  local.identify(dst);
  if (local.size() < remote.size()) {
    raise_code(StatusCode::kInvalidArgument,
               "read_into: dst holds " + bytes_text(local.size()) + ", less than the buffer's " +
                   bytes_text(remote.size()) +
                   " (a read copies the whole buffer into the front of dst)");
  }
  std::vector<Op> ops;
  ops.push_back(local.op(OpKind::kReadIntoLocal, remote));
  std::vector<PyLocal> locals;
  locals.push_back(std::move(local));
  auto t = std::make_unique<PyTransfer>(std::move(self), /*single=*/true);
  t->start(m, std::move(ops), std::move(locals), ms, notify);
  return t;
}

std::unique_ptr<PyTransfer> write_from(py::object self, const RemoteBuffer& remote, py::handle src,
                                       std::optional<double> timeout, bool notify) {
  auto& pm = self.cast<PyManager&>();
  Manager& m = pm.get();
  check_handle(remote);
  const auto ms = pm.timeout_ms(timeout);
  PyLocal local = PyLocal::acquire(src, /*writable=*/false, "write_from: src", /*strided=*/true);
  local.identify(src);
  if (local.size() > remote.size()) {
    raise_code(StatusCode::kInvalidArgument,
               "write_from: src holds " + bytes_text(local.size()) + ", more than the buffer's " +
                   bytes_text(remote.size()) +
                   " (a write copies the whole of src into the front of the buffer)");
  }
  std::vector<Op> ops;
  ops.push_back(local.op(OpKind::kWriteFromLocal, remote));
  std::vector<PyLocal> locals;
  locals.push_back(std::move(local));
  auto t = std::make_unique<PyTransfer>(std::move(self), /*single=*/true);
  t->start(m, std::move(ops), std::move(locals), ms, notify);
  return t;
}

// A read whose local range overlaps another op's local range races with it
// (two reads into the same bytes, or a read into bytes a write sends).
void check_overlaps(const std::vector<Op>& ops) {
  struct Range {
    uintptr_t start, end;
    bool read;
    size_t index;
  };
  std::vector<Range> ranges;
  ranges.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto start = reinterpret_cast<uintptr_t>(ops[i].local.data());
    // An atomic writes the word's previous value into its local memory.
    const bool writes_local = ops[i].kind != OpKind::kWriteFromLocal;
    if (ops[i].ranges) {  // each range of a scattered op (its own are checked by submit)
      for (const OpRange& r : ops[i].ranges->ranges()) {
        ranges.push_back(
            {start + r.local_offset, start + r.local_offset + r.length, writes_local, i});
      }
      continue;
    }
    const uint64_t len = ops[i].kind == OpKind::kWriteFromLocal ? ops[i].local.size()
                         : ops[i].is_atomic()                   ? Op::kAtomicWordBytes
                                                                : ops[i].remote.size();
    if (len == 0) continue;
    ranges.push_back({start, start + len, writes_local, i});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.start < b.start; });
  uintptr_t end_any = 0, end_read = 0;
  size_t last_any = 0, last_read = 0;
  for (const Range& r : ranges) {
    std::optional<size_t> other;
    if (r.start < end_read) {
      other = last_read;
    } else if (r.read && r.start < end_any) {
      other = last_any;
    }
    if (other && *other != r.index) {  // one op's own ranges: Manager::submit says why
      raise_code(StatusCode::kInvalidArgument,
                 "RDMAAction: the local memory of op " + std::to_string(std::min(*other, r.index)) +
                     " overlaps that of op " + std::to_string(std::max(*other, r.index)) +
                     ", and at least one of them is a read or an atomic into it");
    }
    if (r.end > end_any) {
      end_any = r.end;
      last_any = r.index;
    }
    if (r.read && r.end > end_read) {
      end_read = r.end;
      last_read = r.index;
    }
  }
}

// The (remote offset, local offset, length) triples of Python's `ranges`.
std::vector<OpRange> ranges_from(py::handle list) {
  std::vector<OpRange> ranges;
  for (py::handle item : list) {
    auto t = item.cast<py::tuple>();
    ranges.push_back(OpRange{t[0].cast<uint64_t>(), t[1].cast<uint64_t>(), t[2].cast<uint64_t>()});
  }
  return ranges;
}

// ops: (kind, handle, local object, operand, compare, ranges or None) per
// op; kind as in OpKind.
std::unique_ptr<PyTransfer> submit(py::object self, const py::list& specs,
                                   std::optional<double> timeout, bool notify) {
  auto& pm = self.cast<PyManager&>();
  Manager& m = pm.get();
  const auto ms = pm.timeout_ms(timeout);
  std::vector<Op> ops;
  std::vector<PyLocal> locals;
  ops.reserve(specs.size());
  locals.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    auto spec = specs[i].cast<py::tuple>();
    const int kind = spec[0].cast<int>();
    if (kind < 0 || kind > static_cast<int>(OpKind::kCompareAndSwap)) {
      raise_code(StatusCode::kInvalidArgument,
                 "RDMAAction op " + std::to_string(i) + ": unknown kind " + std::to_string(kind));
    }
    const auto op_kind = static_cast<OpKind>(kind);
    const bool is_read = op_kind == OpKind::kReadIntoLocal;
    const bool is_write = op_kind == OpKind::kWriteFromLocal;
    const auto& remote = spec[1].cast<const RemoteBuffer&>();
    check_handle(remote);
    const std::string what = "RDMAAction op " + std::to_string(i) + (is_write ? ": src" : ": dst");
    const bool atomic = !is_read && !is_write;
    PyLocal local = PyLocal::acquire(spec[2], !is_write, what.c_str(), /*strided=*/!atomic);
    local.identify(spec[2]);
    if (atomic) {  // sizes were checked when it was added
      const auto operand = spec[3].cast<uint64_t>();
      const auto compare = spec[4].cast<uint64_t>();
      ops.push_back(op_kind == OpKind::kFetchAdd
                        ? Op::fetch_add(remote, local.memory(), operand)
                        : Op::compare_and_swap(remote, local.memory(), compare, operand));
      locals.push_back(std::move(local));
      continue;
    }
    if (!spec[5].is_none()) {  // explicit ranges, in bytes of contiguous local memory
      if (!local.contiguous()) {
        raise_code(StatusCode::kInvalidArgument,
                   what + " is not contiguous: ranges= take offsets into contiguous memory");
      }
      ops.push_back(is_read ? Op::read_ranges(remote, local.memory(), ranges_from(spec[5]))
                            : Op::write_ranges(remote, local.memory(), ranges_from(spec[5])));
      locals.push_back(std::move(local));
      continue;
    }
    if (is_read && local.size() < remote.size()) {
      raise_code(StatusCode::kInvalidArgument, what + " holds " + bytes_text(local.size()) +
                                                   ", less than the buffer's " +
                                                   bytes_text(remote.size()));
    }
    if (!is_read && local.size() > remote.size()) {
      raise_code(StatusCode::kInvalidArgument, what + " holds " + bytes_text(local.size()) +
                                                   ", more than the buffer's " +
                                                   bytes_text(remote.size()));
    }
    ops.push_back(local.op(op_kind, remote));
    locals.push_back(std::move(local));
  }
  check_overlaps(ops);
  auto t = std::make_unique<PyTransfer>(std::move(self), /*single=*/false);
  t->start(m, std::move(ops), std::move(locals), ms, notify);
  return t;
}

py::list backends_list(PyManager& pm) {
  py::list out;
  for (const BackendInfo& b : pm.get().backends()) {
    py::list details;
    for (const auto& [k, v] : b.details)
      details.append(py::make_tuple(k, v));
    out.append(py::make_tuple(b.name, transport_level_name(b.level), b.viable, b.reason, details));
  }
  return out;
}

}  // namespace

void check_handle(const RemoteBuffer& remote) {
  if (!remote.valid()) raise_code(StatusCode::kInvalidArgument, "the handle is empty");
}

}  // namespace rdmabuf::python

PYBIND11_MODULE(_rdmabuf, m) {
  using namespace rdmabuf;
  using namespace rdmabuf::python;
  m.doc() = "The compiled layer of rdmabuf (private: use the rdmabuf package).";
  install_fork_handler();

  m.def("version", [] { return std::string(rdmabuf::version()); });
  m.def("set_error_types", &set_error_types);
  m.def("status_code_name",
        [](int code) { return std::string(status_code_name(static_cast<StatusCode>(code))); });
  m.def("is_retryable", [](int code) { return is_retryable(static_cast<StatusCode>(code)); });
  m.def(
      "make_config",
      [](const py::dict& overrides) { return config_to_dict(make_config(overrides)); },
      "Config::from_env() with the overrides applied, validated, as a dict.");
  m.def(
      "local_size",
      [](py::handle obj, bool writable, bool strided) {
        return PyLocal::acquire(obj, writable, writable ? "dst" : "src", strided).size();
      },
      py::arg("obj"), py::arg("writable"), py::arg("strided") = true,
      "Checks obj as local memory (as read_into/write_from do; strided: any dense array or "
      "tensor, as transfers take) and returns the bytes of its elements.");
  m.def(
      "local_span",
      [](py::handle obj) {
        const PyLocal local = PyLocal::acquire(obj, false, "data", true);
        return py::make_tuple(reinterpret_cast<uintptr_t>(local.memory().data()),
                              local.memory().size());
      },
      py::arg("obj"),
      "Where obj's elements lie: (address of the lowest byte, bytes to past the highest).");
  m.def("fork_generation", &fork_generation);
  m.def("storage_identity_count", &storage_identity_count);

  py::class_<RemoteBuffer>(m, "Handle")
      .def_property_readonly("id", &RemoteBuffer::id)
      .def_property_readonly("size", &RemoteBuffer::size)
      .def_property_readonly("offset", &RemoteBuffer::offset)
      .def_property_readonly("region_size", &RemoteBuffer::region_size)
      .def_property_readonly("owner", [](const RemoteBuffer& h) { return owner_tuple(h.owner()); })
      .def_property_readonly("backends",
                             [](const RemoteBuffer& h) {
                               py::list names;
                               for (const BackendContext& c : h.contexts())
                                 names.append(c.backend);
                               return names;
                             })
      .def("to_bytes",
           [](const RemoteBuffer& h) {
             check_handle(h);
             std::vector<uint8_t> bytes = h.to_bytes();
             return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
           })
      .def_static("from_bytes", &handle_from_bytes)
      .def("to_text",
           [](const RemoteBuffer& h) {
             check_handle(h);
             return h.to_text();
           })
      .def_static("from_text",
                  [](const std::string& text) {
                    auto handle = RemoteBuffer::from_text(text);
                    if (!handle.ok()) raise_status(handle.status());
                    return std::move(handle).value();
                  })
      .def("slice",
           [](const RemoteBuffer& h, uint64_t offset, uint64_t length) {
             auto s = h.slice(offset, length);
             if (!s.ok()) raise_status(s.status());
             return std::move(s).value();
           })
      .def("describe", &RemoteBuffer::describe);

  py::class_<Notifier, std::shared_ptr<Notifier>>(m, "Notifier")
      .def(py::init<>())
      .def_property_readonly("fd", &Notifier::fd)
      .def("drain", &Notifier::drain);

  py::class_<PyTransfer>(m, "Transfer")
      .def("done", &PyTransfer::done)
      .def("wait", &PyTransfer::wait, py::arg("timeout") = py::none())
      .def("result", &PyTransfer::result)
      .def("wait_result", &PyTransfer::wait_result, py::arg("timeout") = py::none())
      .def("cancel", &PyTransfer::cancel)
      .def("attach", &PyTransfer::attach);

  py::class_<PyRegistration>(m, "Registration")
      .def_property_readonly("handle", [](const PyRegistration& r) { return r.handle(); })
      .def_property_readonly("dropped", &PyRegistration::dropped)
      .def("drop", &PyRegistration::drop);

  py::class_<PyManager> manager(m, "Manager");
  manager
      .def(py::init([](const py::dict& overrides) {
        Config config = make_config(overrides);
        Result<std::unique_ptr<Manager>> created = [&] {
          py::gil_scoped_release nogil;
          return Manager::create(config);
        }();
        if (!created.ok()) raise_status(created.status());
        return std::make_unique<PyManager>(std::move(created).value());
      }))
      .def("config", [](const PyManager& pm) { return config_to_dict(pm.peek().config()); })
      .def("identity", [](const PyManager& pm) { return owner_tuple(pm.peek().identity()); })
      .def("backends", &backends_list)
      .def("registered_count", [](PyManager& pm) { return pm.get().registered_count(); })
      .def("transport_for",
           [](PyManager& pm, const RemoteBuffer& remote) {
             check_handle(remote);
             Manager& manager_of = pm.get();
             Result<std::string> name = [&] {
               py::gil_scoped_release nogil;
               return manager_of.transport_for(remote);
             }();
             if (!name.ok()) raise_status(name.status());
             return std::move(name).value();
           })
      .def("register", &register_data)
      .def("read_into", &read_into)
      .def("write_from", &write_from)
      .def("submit", &submit)
      .def("shutdown", &PyManager::shutdown)
      .def_property_readonly("shut_down", &PyManager::shut_down)
      .def_property_readonly("in_this_process", &PyManager::in_this_process);
  bind_endpoints(m, manager);
  bind_allocation(m);
}
