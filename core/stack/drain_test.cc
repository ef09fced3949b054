// drain_qp on every personality: 100 outstanding WRs each complete exactly once, in order, by
// the method the provider allows; SRQ-attached drains with and without QP_LAST_WQE_REACHED.
#include "stack/drain.h"

#include <gtest/gtest.h>

#include "rdmalab/error.h"
#include "stack/test_lab.h"

namespace rdmalab::stack {
namespace {

using fixture::TwoHosts;

struct DrainCase {
  std::string personality;
  std::string method;
};

class DrainTest : public ::testing::TestWithParam<DrainCase> {};

// 50 sends that can never be acked (a -> b is cut) and 50 receives that nothing consumes.
void post_outstanding(TwoHosts& lab, Traffic& traffic, Qp& qp) {
  for (uint64_t i = 0; i < 50; ++i) traffic.post_recv(qp, TwoHosts::recv_wr(lab.a, 64, 64 * i));
  for (uint64_t i = 0; i < 50; ++i) traffic.post_send(qp, TwoHosts::send_wr(lab.a, 64, 64 * i));
}

TEST_P(DrainTest, HundredOutstandingCompleteExactlyOnce) {
  TwoHosts lab(GetParam().personality);
  auto [qa, qb] = lab.connected_pair();
  CompletionLedger ledger(&lab.history(), "a");
  Traffic traffic(lab.rt(), ledger, &lab.history(), "a");
  lab.cut_a_to_b();
  post_outstanding(lab, traffic, *qa);
  lab.rt().sleep_for(10 * kNsPerUs);  // the first sends are on the wire
  // siw: a SEND completes once handed to TCP (caps.send_completes_on_handoff, Q4).
  const bool handoff = lab.a.ctx->caps().send_completes_on_handoff;
  const uint64_t sends = handoff ? 0 : 50;  // SEND WRs the drain has to flush
  ASSERT_EQ(ledger.outstanding(qa->label(), WorkQueue::SQ), 50u);  // none polled yet

  // The drain asks the QP's device what a post in ERR does (caps.err_post).
  const DrainReport r =
      drain_qp(lab.rt(), *qa, traffic, *lab.a.cq, *lab.a.cq, lab.in(2 * kNsPerSec));
  EXPECT_TRUE(r.complete) << r.detail;
  EXPECT_EQ(r.method, GetParam().method) << r.detail;
  EXPECT_EQ(r.outstanding_sq, 50u);
  EXPECT_EQ(r.outstanding_rq, 50u);
  EXPECT_EQ(r.flushed, 50u + sends);
  EXPECT_EQ(r.succeeded, 50u - sends);  // handed to TCP: SUCCESS (Q4)
  EXPECT_EQ(r.errored, 0u);
  EXPECT_TRUE(r.order_kept);
  EXPECT_LT(r.elapsed_ns, 2 * kNsPerSec);
  EXPECT_EQ(qa->state(), QpState::ERR);

  const LedgerReport lr = ledger.check();
  EXPECT_TRUE(lr.exactly_once()) << lr.violations.size() << " violations, " << lr.unknown
                                 << " unknown";
  const uint64_t markers = r.method == "marker" ? 2 : 0;
  EXPECT_EQ(lr.posted, 100u + markers);
  EXPECT_EQ(lr.flushed, 50u + sends + markers);
}

TEST_P(DrainTest, IdleQpDrainsAtOnce) {
  TwoHosts lab(GetParam().personality);
  auto [qa, qb] = lab.connected_pair();
  CompletionLedger ledger;
  Traffic traffic(lab.rt(), ledger);
  const DrainReport r = drain_qp(lab.rt(), *qa, traffic, *lab.a.cq, *lab.a.cq, lab.in(kNsPerSec));
  EXPECT_TRUE(r.complete) << r.detail;
  EXPECT_EQ(r.flushed, 0u);
  EXPECT_TRUE(ledger.check().exactly_once());
}

INSTANTIATE_TEST_SUITE_P(Personalities, DrainTest,
                         ::testing::Values(DrainCase{"roce", "marker"}, DrainCase{"ib", "marker"},
                                           DrainCase{"iwarp-cxgb4", "counting"},
                                           DrainCase{"iwarp-siw", "counting"},  // strand
                                           DrainCase{"mana", "marker"}),
                         [](const auto& info) {
                           std::string n = info.param.personality;
                           for (auto& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

// A provider that loses a completion: the drain must stop at its deadline and name the WR.
TEST(DrainTest, LostCompletionEndsAtDeadlineNamingTheWr) {
  TwoHosts lab("ib");
  auto [qa, qb] = lab.connected_pair();
  CompletionLedger ledger;
  Traffic traffic(lab.rt(), ledger);
  post_outstanding(lab, traffic, *qa);
  ledger.on_post(qa->label(), qa->qp_num(), WorkQueue::SQ, 999999);  // never reached the QP
  const TimeNs start = lab.rt().now_ns();
  const DrainReport r =
      drain_qp(lab.rt(), *qa, traffic, *lab.a.cq, *lab.a.cq, start + 10 * kNsPerMs);
  EXPECT_FALSE(r.complete);
  EXPECT_NE(r.detail.find("SQ 1 outstanding (wr_id 999999)"), std::string::npos) << r.detail;
  EXPECT_EQ(r.elapsed_ns, 10 * kNsPerMs);
  EXPECT_EQ(r.flushed, 100u);
  EXPECT_EQ(ledger.check().unknown_wr_ids, std::vector<uint64_t>{999999});
}

// A drain whose CQ overflows: the flushes of 100 WRs do not fit a 4-entry CQ (7 on mlx5), the
// CQ_ERR is read by the dispatcher, and the drain stops there naming the CQ instead of waiting
// out its deadline for completions that were lost.
TEST(DrainTest, CqOverflowEndsTheDrainAndIsNamed) {
  for (const std::string pers : {"ib", "roce"}) {
    SCOPED_TRACE(pers);
    TwoHosts lab(pers);
    lab.a.cq = lab.a.ctx->create_cq(4);
    auto [qa, qb] = lab.connected_pair();
    CompletionLedger ledger;
    Traffic traffic(lab.rt(), ledger);
    AsyncDispatcher dispatcher(lab.rt(), lab.a.ctx, &lab.history(), "a");
    dispatcher.start();
    lab.cut_a_to_b();
    post_outstanding(lab, traffic, *qa);
    const TimeNs start = lab.rt().now_ns();
    const DrainReport r =
        drain_qp(lab.rt(), *qa, traffic, *lab.a.cq, *lab.a.cq, start + 2 * kNsPerSec, &dispatcher);
    EXPECT_FALSE(r.complete);
    EXPECT_EQ(r.cq_overflow, lab.a.cq->label());
    EXPECT_NE(r.detail.find(lab.a.cq->label() + " overflowed (CQ_ERR)"), std::string::npos)
        << r.detail;
    EXPECT_LT(r.elapsed_ns, 10 * kNsPerMs);  // at the CQ_ERR, not at the 2 s deadline
    EXPECT_GE(dispatcher.count_events(lab.a.cq->id(), AsyncEventType::CQ_ERR), 1u);
    dispatcher.stop(lab.in(kNsPerSec));
  }
}

struct SrqCase {
  std::string personality;
  bool last_wqe_reached;
  std::string method;
};

class SrqDrainTest : public ::testing::TestWithParam<SrqCase> {};

TEST_P(SrqDrainTest, SrqAttachedQp) {
  TwoHosts lab(GetParam().personality);
  auto srq = lab.a.ctx->create_srq(*lab.a.pd, SrqInitAttr{128, 1, 0});
  auto [qa, qb] = lab.connected_pair(srq);
  CompletionLedger ledger(&lab.history(), "a");
  ledger.attach_srq(srq->label(), qa->qp_num());
  Traffic traffic(lab.rt(), ledger, &lab.history(), "a");
  AsyncDispatcher dispatcher(lab.rt(), lab.a.ctx, &lab.history(), "a");
  dispatcher.start();
  lab.cut_a_to_b();
  for (uint64_t i = 0; i < 20; ++i)
    traffic.post_srq_recv(*srq, TwoHosts::recv_wr(lab.a, 64, 64 * i));
  for (uint64_t i = 0; i < 50; ++i) traffic.post_send(*qa, TwoHosts::send_wr(lab.a, 64, 64 * i));

  const DrainReport r = drain_qp(lab.rt(), *qa, traffic, *lab.a.cq, *lab.a.cq,
                                 lab.in(2 * kNsPerSec), &dispatcher, srq.get());
  EXPECT_TRUE(r.srq_attached);
  EXPECT_EQ(r.last_wqe_reached, GetParam().last_wqe_reached) << r.detail;
  EXPECT_EQ(r.method, GetParam().method) << r.detail;
  EXPECT_TRUE(r.complete) << r.detail;
  EXPECT_EQ(r.flushed, 50u);
  EXPECT_TRUE(r.order_kept);
  if (!GetParam().last_wqe_reached) {
    EXPECT_NE(r.detail.find("QP_LAST_WQE_REACHED"), std::string::npos) << r.detail;
  }
  // The SRQ's receives stay posted for other QPs: not flushed, still outstanding.
  EXPECT_EQ(ledger.outstanding(srq->label(), WorkQueue::SRQ), 20u);
  EXPECT_TRUE(ledger.check().violations.empty());
  dispatcher.stop(lab.in(kNsPerSec));
}

INSTANTIATE_TEST_SUITE_P(Personalities, SrqDrainTest,
                         ::testing::Values(SrqCase{"ib", true, "marker"},
                                           SrqCase{"roce", false, "counting"}),
                         [](const auto& info) { return info.param.personality; });

// Without a dispatcher the event cannot be awaited: the drain says so and counts.
TEST(SrqDrainNoDispatcherTest, FallsBackToCounting) {
  TwoHosts lab("ib");
  auto srq = lab.a.ctx->create_srq(*lab.a.pd, SrqInitAttr{128, 1, 0});
  auto [qa, qb] = lab.connected_pair(srq);
  CompletionLedger ledger;
  Traffic traffic(lab.rt(), ledger);
  lab.cut_a_to_b();
  for (uint64_t i = 0; i < 10; ++i) traffic.post_send(*qa, TwoHosts::send_wr(lab.a, 64, 64 * i));
  const DrainReport r =
      drain_qp(lab.rt(), *qa, traffic, *lab.a.cq, *lab.a.cq, lab.in(kNsPerSec), nullptr, srq.get());
  EXPECT_FALSE(r.last_wqe_reached);
  EXPECT_EQ(r.method, "counting");
  EXPECT_NE(r.detail.find("no dispatcher"), std::string::npos) << r.detail;
  EXPECT_TRUE(r.complete) << r.detail;
  EXPECT_EQ(r.flushed, 10u);
}

// A Traffic of one host takes only that host's objects; a drain only objects of its QP's context.
TEST(TrafficTest, RefusesObjectsOfAnotherHost) {
  TwoHosts lab("ib");
  auto qa = lab.create_rc(lab.a);
  CompletionLedger ledger(&lab.history(), "b");
  Traffic traffic(lab.rt(), ledger, &lab.history(), "b");
  const std::string of_a = " is of " + lab.a.ctx->label() + " on host a, not of host b";
  try {
    traffic.post_send(*qa, TwoHosts::send_wr(lab.a, 64));
    FAIL() << "post_send took a QP of another host";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EINVAL);
    EXPECT_EQ(e.verb(), "Traffic::post_send");
    EXPECT_EQ(e.detail(), "qp " + qa->label() + of_a);
  }
  try {
    traffic.poll(*lab.a.cq);
    FAIL() << "poll took a CQ of another host";
  } catch (const Error& e) {
    EXPECT_EQ(e.detail(), "cq " + lab.a.cq->label() + of_a);
  }
  EXPECT_EQ(ledger.check().posted, 0u);
  CompletionLedger la(&lab.history(), "a");
  Traffic ta(lab.rt(), la, &lab.history(), "a");
  try {
    drain_qp(lab.rt(), *qa, ta, *lab.b.cq, *lab.a.cq, lab.in(kNsPerSec));
    FAIL() << "drain took a CQ of another host";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EINVAL);
    EXPECT_EQ(e.verb(), "drain");
    EXPECT_EQ(e.detail(), "send_cq " + lab.b.cq->label() + " is of " + lab.b.ctx->label() +
                              " on host b, not of " + lab.a.ctx->label() + " on host a");
  }
  EXPECT_EQ(qa->state(), QpState::RESET);
}

}  // namespace
}  // namespace rdmalab::stack
