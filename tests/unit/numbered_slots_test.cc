// NumberedSlots (core/endpoint/numbered_slots.h): records under consecutive numbers,
// found and erased in any order while the ring wraps and grows; records
// that stay put; erased records that let go of what they held.
#include "core/endpoint/numbered_slots.h"

#include <gtest/gtest.h>

#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>

namespace rdmabuf {
namespace {

struct Record {
  std::string text;
  void reset() { text.clear(); }
};

TEST(NumberedSlots, FindsWhatIsHeldWhileTheRingWrapsAndGrowsAndEndsOutOfOrder) {
  NumberedSlots<Record> slots;
  std::set<uint64_t> held;
  std::map<uint64_t, Record*> where;  // a record stays put while held
  uint64_t next = 1000;               // not 0: the front starts part way round
  for (int round = 0; round < 300; ++round) {
    for (int i = 0; i < round % 9 + 1; ++i) {
      Record& r = slots.add(next);
      ASSERT_TRUE(r.text.empty()) << "a slot used before was reset";
      r.text = "record " + std::to_string(next);
      where[next] = &r;
      held.insert(next++);
    }
    // End some: the oldest, the newest, and one from the middle.
    for (int i = 0; i < round % 4 && !held.empty(); ++i) {
      auto it = held.begin();
      if (i == 1) it = std::prev(held.end());
      if (i == 2) std::advance(it, static_cast<long>(held.size() / 2));
      slots.erase(*it);
      where.erase(*it);
      held.erase(it);
    }
    for (uint64_t n = next - std::min<uint64_t>(next, 200); n < next + 3; ++n) {
      Record* found = slots.find(n);
      if (held.count(n) == 0) {
        ASSERT_EQ(found, nullptr) << "number " << n << " is not held";
      } else {
        ASSERT_EQ(found, where[n]) << "number " << n << " moved";
        ASSERT_EQ(found->text, "record " + std::to_string(n));
      }
    }
  }
  std::vector<uint64_t> seen;
  slots.for_each([&](uint64_t n, Record& r) {
    EXPECT_EQ(r.text, "record " + std::to_string(n));
    seen.push_back(n);
  });
  EXPECT_EQ(seen, std::vector<uint64_t>(held.begin(), held.end())) << "oldest first";
  for (uint64_t n : held) {
    EXPECT_FALSE(slots.empty());
    slots.erase(n);
  }
  EXPECT_TRUE(slots.empty()) << "every record ended";
  // Empty, it takes any number next.
  slots.add(next + 1000).text = "after";
  EXPECT_FALSE(slots.empty());
  ASSERT_NE(slots.find(next + 1000), nullptr);
  EXPECT_EQ(slots.find(next + 1000)->text, "after");
  EXPECT_EQ(slots.find(next), nullptr);
}

struct WithReset {
  std::shared_ptr<int> held;
  int resets = 0;
  void reset() {
    held.reset();
    ++resets;  // kept: reset() touches only what it lets go of
  }
};

TEST(NumberedSlots, AnErasedRecordLetsGoOfWhatItHeldAtOnce) {
  auto memory = std::make_shared<int>(1);
  NumberedSlots<WithReset> with_reset;
  with_reset.add(7).held = memory;
  with_reset.erase(7);
  EXPECT_EQ(memory.use_count(), 1) << "reset() ran";
  // 23 lands on 7's slot (16 slots): erase() reset it rather than assign
  // a new record.
  EXPECT_EQ(with_reset.add(7 + 16).resets, 1);

  NumberedSlots<std::shared_ptr<int>> plain;
  plain.add(3) = memory;
  plain.add(4) = memory;
  EXPECT_EQ(memory.use_count(), 3);
  plain.erase(4);  // ends early: 3 is still held, the slot is let go of anyway
  EXPECT_EQ(memory.use_count(), 2);
  EXPECT_EQ(plain.find(4), nullptr);
  plain.erase(3);
  EXPECT_EQ(memory.use_count(), 1);
  EXPECT_EQ(plain.find(3), nullptr);
}

}  // namespace
}  // namespace rdmabuf
