#include "backends/ibverbs/ibv_lib.h"

#include <dlfcn.h>

#include <string>

namespace rdmabuf::ibverbs {
namespace {

Result<const IbvLib*> load() {
  void* handle = ::dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    return FailedPrecondition(std::string("cannot load libibverbs.so.1 (install rdma-core): ") +
                              (why ? why : "unknown error"));
  }
  static IbvLib lib;
  std::string missing;
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(handle, name));
    if (!fn) missing += (missing.empty() ? "" : ", ") + std::string(name);
  };
  bind(lib.get_device_list, "ibv_get_device_list");
  bind(lib.free_device_list, "ibv_free_device_list");
  bind(lib.get_device_name, "ibv_get_device_name");
  bind(lib.open_device, "ibv_open_device");
  bind(lib.close_device, "ibv_close_device");
  bind(lib.query_device, "ibv_query_device");
  bind(lib.query_port, "ibv_query_port");
  bind(lib.query_gid, "ibv_query_gid");
  bind(lib.alloc_pd, "ibv_alloc_pd");
  bind(lib.dealloc_pd, "ibv_dealloc_pd");
  bind(lib.reg_mr, "ibv_reg_mr");
  bind(lib.dereg_mr, "ibv_dereg_mr");
  bind(lib.create_cq, "ibv_create_cq");
  bind(lib.destroy_cq, "ibv_destroy_cq");
  bind(lib.create_qp, "ibv_create_qp");
  bind(lib.destroy_qp, "ibv_destroy_qp");
  bind(lib.modify_qp, "ibv_modify_qp");
  bind(lib.wc_status_str, "ibv_wc_status_str");
  bind(lib.create_comp_channel, "ibv_create_comp_channel");
  bind(lib.destroy_comp_channel, "ibv_destroy_comp_channel");
  bind(lib.get_cq_event, "ibv_get_cq_event");
  bind(lib.ack_cq_events, "ibv_ack_cq_events");
  lib.reg_dmabuf_mr = reinterpret_cast<decltype(lib.reg_dmabuf_mr)>(
      ::dlsym(handle, "ibv_reg_dmabuf_mr"));  // optional
  if (!missing.empty()) {
    ::dlclose(handle);
    return FailedPrecondition("libibverbs.so.1 lacks " + missing);
  }
  return &lib;  // never unloaded: providers keep state in it
}

}  // namespace

Result<const IbvLib*> IbvLib::get() {
  static const Result<const IbvLib*> loaded = load();
  return loaded;
}

int IbvLib::take_cq_events(ibv_comp_channel* channel) const {
  int taken = 0;
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  while (get_cq_event(channel, &cq, &context) == 0) {  // EAGAIN ends it
    ack_cq_events(cq, 1);
    ++taken;
  }
  return taken;
}

}  // namespace rdmabuf::ibverbs
