// Two endpoints joined to each other, for the endpoint conformance tests:
// one on the owner's manager, accepted, one on the reader's, connected.
#pragma once

#include <gtest/gtest.h>

#include <future>
#include <memory>

#include "rdmabuf/rdmabuf.h"
#include "tests/conformance/fixture.h"

namespace rdmabuf::conformance {

struct EndpointPair {
  std::unique_ptr<Endpoint> receiver;  // on the owner's manager
  std::unique_ptr<Endpoint> sender;    // on the reader's manager
};

inline EndpointPair connect_endpoints(Manager& receiving, Manager& sending) {
  EndpointPair pair;
  auto listener = receiving.listen("127.0.0.1:0");
  EXPECT_TRUE(listener.ok()) << listener.status().to_string();
  if (!listener.ok()) return pair;
  auto connecting = std::async(std::launch::async,
                               [&] { return sending.connect((*listener)->address(), kTimeout); });
  auto accepted = (*listener)->accept(kTimeout);
  auto connected = connecting.get();
  EXPECT_TRUE(accepted.ok()) << accepted.status().to_string();
  EXPECT_TRUE(connected.ok()) << connected.status().to_string();
  if (accepted.ok()) pair.receiver = std::move(accepted).value();
  if (connected.ok()) pair.sender = std::move(connected).value();
  return pair;
}

}  // namespace rdmabuf::conformance
