// The event queue's bookkeeping, driven by deliver() as the event thread would; no device.
#include "verbs/events.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "rdmalab/error.h"
#include "verbs/real_runtime.h"

namespace rdmalab::verbs {
namespace {

class EventQueueTest : public ::testing::Test {
 protected:
  ibv_async_event qp_event(ibv_event_type t) {
    ibv_async_event e{};
    e.event_type = t;
    e.element.qp = &qp_;
    return e;
  }
  TimeNs soon() const { return monotonic_now_ns() + 20 * kNsPerMs; }

  History history_{[] { return monotonic_now_ns(); }};
  EventQueue q_{&history_, "local"};
  ibv_qp qp_{};
};

TEST_F(EventQueueTest, MapsElementToEngineObject) {
  q_.add_object(&qp_, ObjectKind::QP, 7, 0x99);
  q_.deliver(qp_event(IBV_EVENT_QP_LAST_WQE_REACHED));
  const auto ev = q_.get(soon());
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->type, AsyncEventType::QP_LAST_WQE_REACHED);
  EXPECT_EQ(ev->kind, ObjectKind::QP);
  EXPECT_EQ(ev->object_id, 7u);
  EXPECT_EQ(ev->qp_num, 0x99u);
  EXPECT_EQ(q_.unacked(7), 1u);
  q_.ack(*ev);
  EXPECT_EQ(q_.unacked(7), 0u);
  EXPECT_EQ(history_.size(), 1u);
  EXPECT_EQ(history_.snapshot()[0].kind, "async_event");
  EXPECT_EQ(history_.snapshot()[0].object, "qp:7");
}

TEST_F(EventQueueTest, GetReturnsNulloptAtDeadline) {
  const TimeNs start = monotonic_now_ns();
  EXPECT_FALSE(q_.get(start + 5 * kNsPerMs).has_value());
  EXPECT_GE(monotonic_now_ns() - start, 5 * kNsPerMs);
}

// A controller's clock offset moves every deadline of the process alike: a wait whose deadline
// came from RealRuntime::now_ns() ends on time, not `offset` later (the VM lab's agents hung
// in Dispatcher::stop when the event queue read the raw clock).
TEST_F(EventQueueTest, InterruptEndsAWaitingGetAtOnce) {
  std::thread interrupter([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    q_.interrupt();
  });
  const TimeNs start = monotonic_now_ns();
  EXPECT_FALSE(q_.get(start + 10 * kNsPerSec).has_value());
  EXPECT_LT(monotonic_now_ns() - start, 5 * kNsPerSec);
  interrupter.join();
  // Taken once: the next get waits for its own deadline again.
  EXPECT_FALSE(q_.get(soon()).has_value());
}

TEST_F(EventQueueTest, DeadlineFromRuntimeClockHoldsUnderOffset) {
  RealRuntime::set_clock_offset(1000 * kNsPerSec);
  RealRuntime rt;
  const auto raw_start = std::chrono::steady_clock::now();
  EXPECT_FALSE(q_.get(rt.now_ns() + 5 * kNsPerMs).has_value());
  RealRuntime::set_clock_offset(0);
  EXPECT_LT(std::chrono::steady_clock::now() - raw_start, std::chrono::seconds(5));
}

TEST_F(EventQueueTest, PortEventCarriesPortNumber) {
  ibv_async_event e{};
  e.event_type = IBV_EVENT_PORT_ERR;
  e.element.port_num = 2;
  q_.deliver(e);
  const auto ev = q_.get(soon());
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->kind, ObjectKind::PORT);
  EXPECT_EQ(ev->port_num, 2);
  EXPECT_EQ(ev->object_id, 0u);
}

TEST_F(EventQueueTest, EventForUnknownObjectIsDropped) {
  q_.deliver(qp_event(IBV_EVENT_QP_FATAL));  // &qp_ never added
  EXPECT_FALSE(q_.get(soon()).has_value());
}

TEST_F(EventQueueTest, DestroyWaitsForAckAndFailsAtDeadline) {
  q_.add_object(&qp_, ObjectKind::QP, 7, 1);
  q_.deliver(qp_event(IBV_EVENT_QP_FATAL));
  const auto ev = q_.get(soon());
  ASSERT_TRUE(ev.has_value());
  EXPECT_FALSE(q_.begin_destroy(&qp_, 7, soon()));
  std::thread acker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    q_.ack(*ev);
  });
  EXPECT_TRUE(q_.begin_destroy(&qp_, 7, monotonic_now_ns() + 5 * kNsPerSec));
  acker.join();
}

TEST_F(EventQueueTest, DestroyDropsUnreadEventsAndLaterArrivals) {
  q_.add_object(&qp_, ObjectKind::QP, 7, 1);
  q_.deliver(qp_event(IBV_EVENT_COMM_EST));  // never read
  ASSERT_TRUE(q_.begin_destroy(&qp_, 7, soon()));
  q_.deliver(qp_event(IBV_EVENT_QP_FATAL));  // arrives while ibv_destroy_qp runs
  EXPECT_FALSE(q_.get(soon()).has_value());
  q_.remove_object(&qp_, 7);
}

TEST_F(EventQueueTest, ForceDestroyAcksReadEvents) {
  q_.add_object(&qp_, ObjectKind::QP, 7, 1);
  q_.deliver(qp_event(IBV_EVENT_QP_FATAL));
  const auto ev = q_.get(soon());
  ASSERT_TRUE(ev.has_value());
  q_.force_destroy(&qp_, 7);
  EXPECT_EQ(q_.unacked(7), 0u);
  EXPECT_THROW(q_.ack(*ev), Error);  // already acked on the object's behalf
}

TEST_F(EventQueueTest, DoubleAckIsEinval) {
  q_.add_object(&qp_, ObjectKind::QP, 7, 1);
  q_.deliver(qp_event(IBV_EVENT_COMM_EST));
  const auto ev = q_.get(soon());
  ASSERT_TRUE(ev.has_value());
  q_.ack(*ev);
  try {
    q_.ack(*ev);
    FAIL() << "second ack accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.verb(), "ibv_ack_async_event");
    EXPECT_EQ(e.err(), EINVAL);
  }
}

TEST_F(EventQueueTest, UnmodeledEventIsDropped) {
  ibv_async_event e{};
  e.event_type = IBV_EVENT_WQ_FATAL;
  q_.deliver(e);
  EXPECT_FALSE(q_.get(soon()).has_value());
}

}  // namespace
}  // namespace rdmalab::verbs
