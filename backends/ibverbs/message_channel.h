// Endpoint frames over verbs SEND/RECV (a MessageChannel, rdmabuf/backend.h).
//
// Each side posts kSlots receives of kSlotBytes into registered memory of
// its own and keeps them posted: receives read out are posted again, with
// one call, when the reader next finds nothing to read, or kRepostBatch
// at a time while messages keep coming. A write copies its bytes into
// send slots (registered too) and posts one SEND per slot, so the peer's
// NIC puts them straight into a posted receive; the reader takes them
// where they lie. Small SENDs go inline (in the work request, the
// writer's pieces gathered on the stack, with no copy into a slot), and
// only one in eight asks for a completion (the send queue completes in
// order).
//
// Flow control by credits, with no message for them: each side keeps, in
// a word the peer may read (RDMA READ), how many receives it has posted in
// all, and each of its SENDs carries that count as its immediate. A
// writer may post as many SENDs as the count it last heard or read, so a
// receive is always waiting (never "receiver not ready"). Once fewer than
// half its credits are left it reads the word again, without waiting for
// the answer: a reader that keeps up never holds a writer back, and the
// reader never posts a thing to hand credits back. A peer that writes
// back (an endpoint's credit frames, an echo) hands them back on its
// SENDs, and the read is rarely needed: on Soft-RoCE each one cost the
// peer's kernel a deferred task (and a switch to the thread that runs
// it), and a tenth of 8 B ping-pongs took over twice the median.
//
// A reader that sleeps arms its receive queue's completion events, whose
// file descriptor then becomes readable when a SEND lands.
#pragma once

#include <memory>

#include "backends/ibverbs/device.h"
#include "rdmabuf/backend.h"

namespace rdmabuf::ibverbs {

// A channel on `device`, its receives posted, to be connected (see
// MessageChannel). kResourceExhausted when the device has no room for it.
Result<std::unique_ptr<MessageChannel>> open_message_channel(std::shared_ptr<const Device> device);

}  // namespace rdmabuf::ibverbs
