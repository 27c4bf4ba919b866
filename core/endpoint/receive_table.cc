#include "core/endpoint/receive_table.h"

namespace rdmabuf::endpoint {

Status ReceiveTable::fill(const StateLock& lock, const MessagePart& part, Credits& credits) {
  Receive* filled = slots_.find(part.seq);
  if (filled == nullptr || filled->answered) {
    return ProtocolError("endpoint message part for receive " + std::to_string(part.seq) +
                         ", which is not waiting");
  }
  Receive& receive = *filled;
  if (receive.parts_came == 0) {
    if (part.size > receive.into.size()) {
      return ProtocolError("the peer says it sent more than the receive holds");
    }
    receive.parts_size = part.size;
  } else if (part.size != receive.parts_size) {
    return ProtocolError("the parts of one endpoint message disagree on its size");
  }
  if (part.data.size() > part.size - receive.parts_came) {
    return ProtocolError("an endpoint message part beyond the message's end");
  }
  if (!receive.abandoned) copy_into(receive, receive.parts_came, part.data);
  receive.parts_came += part.data.size();
  if (receive.parts_came < part.size) return Status::Ok();
  credits.used(lock);
  if (receive.abandoned) {
    slots_.erase(part.seq);
    return Status::Ok();
  }
  receive.answered = true;  // its status stays OK
  receive.size = part.size;
  register_when_posted_.store(false, std::memory_order_relaxed);  // parts need no handle
  return Status::Ok();
}

}  // namespace rdmabuf::endpoint
