#include "verbs/cm.h"

#include <gtest/gtest.h>

#include "verbs/test_util.h"
#include "verbs/verbs_lab.h"

namespace rdmalab::verbs {
namespace {

TEST(VerbsCm, EventTypesMirrorLibrdmacm) {
  EXPECT_EQ(cm_event_from_rdma(RDMA_CM_EVENT_ADDR_RESOLVED), CmEventType::ADDR_RESOLVED);
  EXPECT_EQ(cm_event_from_rdma(RDMA_CM_EVENT_CONNECT_REQUEST), CmEventType::CONNECT_REQUEST);
  EXPECT_EQ(cm_event_from_rdma(RDMA_CM_EVENT_REJECTED), CmEventType::REJECTED);
  EXPECT_EQ(cm_event_from_rdma(RDMA_CM_EVENT_DISCONNECTED), CmEventType::DISCONNECTED);
  EXPECT_EQ(cm_event_from_rdma(RDMA_CM_EVENT_TIMEWAIT_EXIT), CmEventType::TIMEWAIT_EXIT);
  EXPECT_EQ(cm_event_from_rdma(RDMA_CM_EVENT_ADDR_CHANGE), CmEventType::ADDR_CHANGE);
  EXPECT_FALSE(cm_event_from_rdma(16).has_value());
}

TEST(VerbsCmNoDevice, CreateEventChannelFailsWithRdmaCmVerb) {
  if (testing::sysfs_has_rdma_device()) GTEST_SKIP() << "this machine has a device";
  VerbsLab lab(1);
  auto p = lab.host("local")->create_process("p");
  try {
    p->create_event_channel();
    FAIL() << "rdma_cm channel without /dev/infiniband/rdma_cm";
  } catch (const Error& e) {
    EXPECT_EQ(e.verb(), "rdma_create_event_channel");
    EXPECT_NE(e.err(), 0);
  }
}

TEST(VerbsCmDevice, ListenerIdLifecycle) {
  RDMALAB_REQUIRE_DEVICE();
  VerbsLab lab(1);
  auto ch = lab.host("local")->create_process("p")->create_event_channel();
  auto id = ch->create_id();
  EXPECT_EQ(id->cm_state(), "IDLE");
  EXPECT_EQ(ch->find_id(id->id()), id);
  id->listen(7471, 4);
  EXPECT_EQ(id->cm_state(), "LISTEN");
  try {
    ch->destroy();
    FAIL() << "channel with ids destroyed";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EBUSY);
  }
  EXPECT_FALSE(ch->get_event(lab.runtime().now_ns() + 10 * kNsPerMs).has_value());
  id->destroy(lab.runtime().now_ns() + kNsPerSec);
  EXPECT_TRUE(id->destroyed());
  ch->destroy();
  EXPECT_TRUE(ch->destroyed());
}

}  // namespace
}  // namespace rdmalab::verbs
