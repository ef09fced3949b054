// The fabric's reorder, the fault switch's (faults/rules.h): a held packet arrives right after the
// next packet of its flow, or at its deadline.
#include "model/fabric.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace rdmalab::model {
namespace fabric_test {  // its own: the tests compile in batches
namespace {

struct Wire {
  Env env{1};
  Fabric fabric{env, FabricOptions{}};  // 2 us latency, no jitter, no loss
  std::vector<std::string> arrivals;    // "psn@t_ns", in arrival order

  // Packets are told apart by psn; dest_qpn names the flow.
  void send(uint32_t psn, uint32_t dest_qpn = 7) {
    Packet p;
    p.src_host = "a";
    p.dst_host = "b";
    p.opcode = "SEND_ONLY";
    p.dest_qpn = dest_qpn;
    p.psn = psn;
    fabric.send(p, [this](const Packet& got) {
      arrivals.push_back(std::to_string(got.psn) + "@" + std::to_string(env.runtime.now_ns()));
    });
  }
  void run_for(TimeNs d) {
    env.runtime.wait_until([] { return false; }, env.runtime.now_ns() + d);
  }
  // Holds the packet with this psn; every other packet passes.
  void reorder(uint32_t psn, TimeNs hold_ns) {
    fabric.rules().add({{"action", "reorder"}, {"psn", psn}, {"hold_ns", hold_ns}});
  }
  std::vector<nlohmann::json> records(const std::string& kind) const {
    std::vector<nlohmann::json> out;
    for (const auto& r : env.history.snapshot())
      if (r.kind == kind) out.push_back(r.data);
    return out;
  }
};

TEST(Fabric, ReorderedPacketArrivesRightAfterTheNextOfItsFlow) {
  Wire w;
  w.reorder(0, kNsPerSec);
  w.send(0);
  w.send(1, 9);  // another QP: not its flow, releases nothing
  w.send(2);
  w.run_for(kNsPerMs);
  EXPECT_EQ(w.arrivals, (std::vector<std::string>{"1@2000", "2@2000", "0@2000"}));
  EXPECT_EQ(w.env.fault_counts["reorder"], 1u);
  const auto held = w.records("fault");
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0]["fault"], "reorder");
  EXPECT_EQ(held[0]["packet"], 1);
  EXPECT_EQ(held[0]["hold_ns"], kNsPerSec);
  const auto released = w.records("reorder_release");
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0]["packet"], 1);
  EXPECT_EQ(released[0]["released_by"], "packet");
  EXPECT_EQ(released[0]["after"], 3);  // psn 2 was packet 3
  w.run_for(2 * kNsPerSec);            // the cancelled deadline delivers nothing more
  EXPECT_EQ(w.arrivals.size(), 3u);
}

TEST(Fabric, ReorderedPacketArrivesAtItsDeadlineWhenItsFlowIsQuiet) {
  Wire w;
  w.reorder(0, 5 * kNsPerMs);
  w.send(0);
  w.send(1, 9);
  w.run_for(10 * kNsPerMs);
  EXPECT_EQ(w.arrivals, (std::vector<std::string>{"1@2000", "0@5002000"}));
  const auto released = w.records("reorder_release");
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0]["released_by"], "deadline");
}

TEST(Fabric, ADelayedPacketReleasesWhatItsFlowHeldWhenItArrives) {
  Wire w;
  w.reorder(0, kNsPerSec);
  w.fabric.rules().add({{"action", "delay"}, {"psn", 1}, {"delay_ns", 3 * kNsPerMs}});
  w.send(0);
  w.send(1);
  w.run_for(10 * kNsPerMs);
  EXPECT_EQ(w.arrivals, (std::vector<std::string>{"1@3002000", "0@3002000"}));
}

TEST(Fabric, PacketsHeldTogetherFollowTheNextInTheirOrder) {
  Wire w;
  w.reorder(0, kNsPerSec);
  w.reorder(1, kNsPerSec);
  w.send(0);
  w.send(1);
  w.send(2);
  w.send(3);
  w.run_for(kNsPerMs);
  EXPECT_EQ(w.arrivals, (std::vector<std::string>{"2@2000", "0@2000", "1@2000", "3@2000"}));
}

}  // namespace
}  // namespace fabric_test
}  // namespace rdmalab::model
