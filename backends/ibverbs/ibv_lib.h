// libibverbs, loaded at run time: rdmabuf builds, loads and runs where it is
// missing, and the ibverbs backend then says why it is not viable.
//
// Only the entry points listed here are used. The data-path calls
// (ibv_post_send, ibv_poll_cq) are inline in <infiniband/verbs.h> and go
// through the provider's function table, so they need no symbol.
#pragma once

#include <infiniband/verbs.h>

#include "rdmabuf/status.h"

namespace rdmabuf::ibverbs {

struct IbvLib {
  // Names differ from the ibv_* ones: some of those are macros in verbs.h.
  ibv_device** (*get_device_list)(int*);
  void (*free_device_list)(ibv_device**);
  const char* (*get_device_name)(ibv_device*);
  ibv_context* (*open_device)(ibv_device*);
  int (*close_device)(ibv_context*);
  int (*query_device)(ibv_context*, ibv_device_attr*);
  int (*query_port)(ibv_context*, uint8_t, ibv_port_attr*);
  int (*query_gid)(ibv_context*, uint8_t, int, ibv_gid*);
  ibv_pd* (*alloc_pd)(ibv_context*);
  int (*dealloc_pd)(ibv_pd*);
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int);
  int (*dereg_mr)(ibv_mr*);
  // Optional (rdma-core 34 and later): null where the library lacks it.
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd*, uint64_t, size_t, uint64_t, int, int);
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int);
  int (*destroy_cq)(ibv_cq*);
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*);
  int (*destroy_qp)(ibv_qp*);
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int);
  const char* (*wc_status_str)(ibv_wc_status);
  ibv_comp_channel* (*create_comp_channel)(ibv_context*);
  int (*destroy_comp_channel)(ibv_comp_channel*);
  int (*get_cq_event)(ibv_comp_channel*, ibv_cq**, void**);
  void (*ack_cq_events)(ibv_cq*, unsigned int);

  // The library, loaded once per process; or why it cannot be.
  static Result<const IbvLib*> get();

  // Takes every event `channel` holds (its descriptor must not block),
  // acknowledging each at once: a completion queue is destroyed only once
  // each event got from it was. How many it took.
  int take_cq_events(ibv_comp_channel* channel) const;
};

}  // namespace rdmabuf::ibverbs
