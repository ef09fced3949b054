// Async events (semantics.md E): what each personality raises, the EQ with driver delay, the
// ack-before-destroy rule, and QPN reuse on mana (seed 002).
#include <gtest/gtest.h>

#include "model/test_util.h"

namespace rdmalab::model {
namespace events_test {  // its own: the tests compile in batches
namespace {

using namespace testing;
using E = AsyncEventType;

struct Two {
  std::shared_ptr<ModelLab> lab;
  Node a, b;
  std::shared_ptr<Qp> qa, qb;
  explicit Two(const std::string& pers, int cqe = 64) {
    lab = lab_of({{"a", pers}, {"b", pers}});
    a = Node::on(*lab, "a", "p", cqe);
    b = Node::on(*lab, "b", "p", cqe);
    qa = a.qp();
    qb = b.qp();
    connect(*qa, *a.ctx, *qb, *b.ctx);
  }
};

TEST(Events, CqOverflowOnRoceLosesEachExtraCompletionAndKeepsTheQp) {
  Two t("roce", 2);
  ASSERT_EQ(t.a.cq->cqe(), 3);  // rxe: roundup_pow_of_two(2 + 1) - 1, all usable
  for (int i = 0; i < 5; ++i) t.qb->post_recv(recv_wr(i, *t.b.mr));
  for (int i = 0; i < 5; ++i) t.qa->post_send(send_wr(i, *t.a.mr));
  t.lab->run_for(kNsPerMs);
  auto evs = read_events(*t.lab, *t.a.ctx);
  EXPECT_EQ(types_of(evs), (std::vector<E>{E::CQ_ERR, E::CQ_ERR}));  // one per lost completion
  EXPECT_EQ(evs[0].object_id, t.a.cq->id());
  EXPECT_EQ(t.qa->state(), QpState::RTS);
  auto wcs = t.a.cq->poll(8);
  ASSERT_EQ(wcs.size(), 3u);
  EXPECT_EQ(wcs[0].wr_id, 0u);
  EXPECT_EQ(count_kind(*t.lab, "wc_lost"), 4u);  // 2 on each side
}

TEST(Events, CqOverflowOnIbRaisesCqErrOnceAndErrorsItsQps) {
  Two t("ib", 2);
  ASSERT_EQ(t.a.cq->cqe(), 3);  // mlx5: a ring of 4, cqe 3 reported
  for (int i = 0; i < 5; ++i) t.qb->post_recv(recv_wr(i, *t.b.mr));
  for (int i = 0; i < 5; ++i) t.qa->post_send(send_wr(i, *t.a.mr));
  t.lab->run_for(kNsPerMs);
  EXPECT_EQ(types_of(read_events(*t.lab, *t.a.ctx)), (std::vector<E>{E::CQ_ERR}));
  EXPECT_EQ(t.qa->state(), QpState::ERR);
  EXPECT_EQ(t.qb->state(), QpState::ERR);
}

// ibv_create_cq(n) reports the provider's size (kernel-facts.md Q11, Linux 6.1): rxe and
// mlx5 pow2(n + 1) - 1, siw pow2(n), cxgb4 roundup(n + 2, 16) - 2, mana n (model).
TEST(Events, CreateCqReportsTheProvidersSize) {
  const std::vector<std::pair<std::string, std::vector<int>>> want = {
      {"roce", {1, 3, 7, 31, 127}},          // n = 1, 2, 4, 16, 100
      {"ib", {1, 3, 7, 31, 127}},
      {"iwarp-siw", {1, 2, 4, 16, 128}},
      {"iwarp-cxgb4", {14, 14, 14, 30, 110}},
      {"mana", {1, 2, 4, 16, 100}}};
  const std::vector<int> asked = {1, 2, 4, 16, 100};
  for (const auto& [pers, cqes] : want) {
    auto lab = lab_of({{"a", pers}});
    Node a = Node::on(*lab, "a");
    for (size_t i = 0; i < asked.size(); ++i) {
      EXPECT_EQ(a.ctx->create_cq(asked[i])->cqe(), cqes[i]) << pers << " n=" << asked[i];
    }
  }
}

// The rounded size is what the CQ holds: with nobody polling, capacity completions fit and
// the next one overflows (CQ_ERR). rxe, siw: the reported cqe; mlx5: its ring, cqe + 1;
// cxgb4: an IQ of max(64, 2 * roundup(n + 2, 16)) less 2 (Q11, inference).
TEST(Events, CqHoldsTheProvidersCapacityThenOverflows) {
  const std::vector<std::pair<std::string, int>> capacity = {
      {"roce", 7}, {"ib", 8}, {"iwarp-siw", 4}, {"iwarp-cxgb4", 62}, {"mana", 4}};
  for (const auto& [pers, cap] : capacity) {
    SCOPED_TRACE(pers);
    for (const int extra : {0, 1}) {
      auto lab = lab_of({{"a", pers}, {"b", pers}});
      Node a = Node::on(*lab, "a", "p", 4);
      Node b = Node::on(*lab, "b", "p", 256);
      QpCap cap_wr;
      cap_wr.max_send_wr = 128;
      cap_wr.max_recv_wr = 128;
      auto qa = a.qp(QpType::RC, nullptr, cap_wr);
      auto qb = b.qp(QpType::RC, nullptr, cap_wr);
      connect(*qa, *a.ctx, *qb, *b.ctx);
      const int n = cap + extra;  // signaled SENDs: n completions on a's CQ
      for (int i = 0; i < n; ++i) qb->post_recv(recv_wr(i, *b.mr, 16, 16 * (i % 64)));
      for (int i = 0; i < n; ++i) qa->post_send(send_wr(i, *a.mr));
      lab->run_for(10 * kNsPerMs);
      EXPECT_EQ(count_kind(*lab, "wc_lost"), extra == 1 ? 1u : 0u) << "n=" << n;
      if (a.ctx->caps().raises_event(E::CQ_ERR)) {  // mana raises QP_FATAL only
        EXPECT_EQ(types_of(read_events(*lab, *a.ctx)),
                  extra == 1 ? std::vector<E>{E::CQ_ERR} : std::vector<E>{})
            << "n=" << n;
      }
    }
  }
}

TEST(Events, SrqLimitReachedOnceThenDisarmed) {
  auto lab = lab_of({{"a", "roce"}, {"b", "roce"}});
  Node a = Node::on(*lab, "a");
  Node b = Node::on(*lab, "b");
  SrqInitAttr sa;
  sa.max_wr = 16;
  auto srq = b.ctx->create_srq(*b.pd, sa);
  auto qa = a.qp();
  auto qb = b.qp(QpType::RC, srq);
  connect(*qa, *a.ctx, *qb, *b.ctx);
  for (int i = 0; i < 5; ++i) srq->post_recv(recv_wr(i, *b.mr, 64, 64 * i));
  EXPECT_EQ(err_of([&] { qb->post_recv(recv_wr(9, *b.mr)); }), EINVAL);  // the QP uses the SRQ
  srq->arm_limit(3);
  EXPECT_EQ(srq->limit(), 3u);
  qa->post_send(send_wr(1, *a.mr));  // 4 left: not below 3
  qa->post_send(send_wr(2, *a.mr));  // 3 left
  EXPECT_EQ(wait_wcs(*lab, *b.cq, 2).size(), 2u);
  EXPECT_TRUE(read_events(*lab, *b.ctx).empty());
  qa->post_send(send_wr(3, *a.mr));  // 2 left: below the limit
  qa->post_send(send_wr(4, *a.mr));
  EXPECT_EQ(wait_wcs(*lab, *b.cq, 2).size(), 2u);
  auto evs = read_events(*lab, *b.ctx);
  ASSERT_EQ(types_of(evs), (std::vector<E>{E::SRQ_LIMIT_REACHED}));
  EXPECT_EQ(evs[0].srq_num, srq->srq_num());
  EXPECT_EQ(evs[0].object_id, srq->id());
  EXPECT_EQ(srq->limit(), 0u);
  EXPECT_EQ(srq->outstanding(), 1u);
}

// siw (siw_qp_rx.c siw_rqe_get -> siw_srq_event) and cxgb4 (c4iw_dispatch_srq_limit_reached_event
// from c4iw_poll_cq / the T4_SRQ_LIMIT_SUPPORT notification) raise SRQ_LIMIT_REACHED too.
TEST(Events, SrqLimitReachedOnIwarp) {
  for (const std::string pers : {"iwarp-siw", "iwarp-cxgb4"}) {
    SCOPED_TRACE(pers);
    auto lab = lab_of({{"a", pers}, {"b", pers}});
    Node a = Node::on(*lab, "a");
    Node b = Node::on(*lab, "b");
    SrqInitAttr sa;
    sa.max_wr = 16;
    auto srq = b.ctx->create_srq(*b.pd, sa);
    auto qa = a.qp();
    auto qb = b.qp(QpType::RC, srq);
    connect(*qa, *a.ctx, *qb, *b.ctx);
    for (int i = 0; i < 5; ++i) srq->post_recv(recv_wr(i, *b.mr, 64, 64 * i));
    srq->arm_limit(3);
    for (int i = 0; i < 3; ++i) qa->post_send(send_wr(i, *a.mr));  // 2 left: below 3
    EXPECT_EQ(wait_wcs(*lab, *b.cq, 3).size(), 3u);
    auto evs = read_events(*lab, *b.ctx);
    ASSERT_EQ(types_of(evs), (std::vector<E>{E::SRQ_LIMIT_REACHED}));
    EXPECT_EQ(evs[0].object_id, srq->id());
    EXPECT_EQ(srq->limit(), 0u);
  }
}

TEST(Events, LastWqeReachedWhenAnSrqQpEntersErrOnIbOnly) {
  for (const std::string pers : {"ib", "roce"}) {
    auto lab = lab_of({{"a", pers}});
    Node a = Node::on(*lab, "a");
    auto srq = a.ctx->create_srq(*a.pd, SrqInitAttr{});
    auto qp = a.qp(QpType::RC, srq);
    to_init(*qp, ACCESS_LOCAL_WRITE);
    modify_state(*qp, QpState::ERR);
    auto evs = types_of(read_events(*lab, *a.ctx));
    if (pers == "ib") {
      EXPECT_EQ(evs, (std::vector<E>{E::QP_LAST_WQE_REACHED}));
    } else {
      EXPECT_TRUE(evs.empty()) << "no LAST_WQE_REACHED on rxe (vmlab.md)";
    }
  }
}

TEST(Events, CommEstOnFirstPacketInRtrOnIb) {
  for (const std::string pers : {"ib", "roce"}) {
    auto lab = lab_of({{"a", pers}, {"b", pers}});
    Node a = Node::on(*lab, "a");
    Node b = Node::on(*lab, "b");
    auto qa = a.qp();
    auto qb = b.qp();
    to_init(*qa, ACCESS_LOCAL_WRITE);
    to_init(*qb, ACCESS_LOCAL_WRITE);
    to_rtr(*qa, b.ctx->query_gid(1, 0), qb->qp_num(), RcParams{});
    to_rtr(*qb, a.ctx->query_gid(1, 0), qa->qp_num(), RcParams{});
    to_rts(*qa, RcParams{});  // qb stays in RTR: data before RTU
    qb->post_recv(recv_wr(1, *b.mr));
    qb->post_recv(recv_wr(2, *b.mr));
    qa->post_send(send_wr(1, *a.mr));
    qa->post_send(send_wr(2, *a.mr));
    EXPECT_EQ(wait_wcs(*lab, *b.cq, 2).size(), 2u);
    auto evs = read_events(*lab, *b.ctx);
    if (pers == "ib") {
      ASSERT_EQ(types_of(evs), (std::vector<E>{E::COMM_EST}));  // once
      EXPECT_EQ(evs[0].qp_num, qb->qp_num());
    } else {
      EXPECT_TRUE(evs.empty());
    }
  }
}

TEST(Events, DestroyWaitsForAcksAndIsEbusyAtTheDeadline) {
  Two t("ib");
  t.lab->inject_async_event("a", E::QP_FATAL, t.qa->qp_num(), 5 * kNsPerUs);
  EXPECT_EQ(t.qa->state(), QpState::ERR);  // the hardware error moves the QP at once
  auto ev = t.a.ctx->get_async_event(t.lab->runtime().now_ns() + kNsPerMs);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->type, E::QP_FATAL);
  EXPECT_EQ(ev->object_id, t.qa->id());
  const TimeNs deadline = t.lab->runtime().now_ns() + 10 * kNsPerMs;
  try {
    t.qa->destroy(deadline);
    FAIL() << "destroy returned with an unacked event";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EBUSY);
    EXPECT_EQ(e.verb(), "ibv_destroy_qp");
  }
  EXPECT_EQ(t.lab->runtime().now_ns(), deadline);
  EXPECT_FALSE(t.qa->destroyed());
  EXPECT_EQ(t.qa->state(), QpState::ERR);
  t.a.ctx->ack_async_event(*ev);
  EXPECT_NO_THROW(t.qa->destroy(t.lab->runtime().now_ns() + kNsPerMs));
  EXPECT_TRUE(t.qa->destroyed());
}

TEST(Events, DestroyReturnsOnceAnotherThreadAcks) {
  Two t("ib");
  t.lab->inject_async_event("a", E::QP_FATAL, t.qa->qp_num(), 0);
  auto ev = t.a.ctx->get_async_event(t.lab->runtime().now_ns() + kNsPerMs);
  ASSERT_TRUE(ev.has_value());
  auto ctx = t.a.ctx;
  const AsyncEvent copy = *ev;
  t.lab->runtime().spawn("acker", [&, ctx, copy] {
    t.lab->runtime().sleep_for(3 * kNsPerMs);
    ctx->ack_async_event(copy);
  });
  const TimeNs t0 = t.lab->runtime().now_ns();
  t.qa->destroy(t0 + kNsPerSec);
  EXPECT_EQ(t.lab->runtime().now_ns() - t0, 3 * kNsPerMs);
}

TEST(Events, UnreadEventsAreDiscardedOnDestroy) {
  Two t("ib");
  t.lab->inject_async_event("a", E::QP_FATAL, t.qa->qp_num(), 0);
  t.lab->run_for(kNsPerUs);
  t.qa->destroy(t.lab->runtime().now_ns());  // the event was never read: nothing to wait for
  EXPECT_TRUE(read_events(*t.lab, *t.a.ctx).empty());
}

TEST(Events, InjectChecksPersonalityAndObject) {
  Two t("roce");
  EXPECT_EQ(err_of([&] { t.lab->inject_async_event("a", E::QP_FATAL, t.qa->qp_num(), 0); }),
            EOPNOTSUPP);
  EXPECT_EQ(err_of([&] { t.lab->inject_async_event("a", E::CQ_ERR, 999999, 0); }), ENOENT);
  EXPECT_EQ(err_of([&] { t.lab->inject_async_event("a", E::PORT_ERR, 2, 0); }), ENOENT);
  EXPECT_EQ(err_of([&] { t.lab->inject_async_event("zz", E::PORT_ERR, 1, 0); }), ENOENT);
  EXPECT_EQ(err_of([&] { t.lab->device_fatal("a"); }), EOPNOTSUPP);
  Two m("ib");
  EXPECT_EQ(err_of([&] { m.lab->inject_async_event("a", E::QP_FATAL, 12345, 0); }), ENOENT);
  m.lab->inject_async_event("a", E::CQ_ERR, static_cast<uint32_t>(m.a.cq->id()), 0);
  auto evs = read_events(*m.lab, *m.a.ctx);
  ASSERT_EQ(types_of(evs), (std::vector<E>{E::CQ_ERR}));
  EXPECT_EQ(evs[0].object_id, m.a.cq->id());
  EXPECT_EQ(m.lab->fault_counts()["async_event"], 1u);
}

TEST(Events, DriverDelayIsVirtualTime) {
  Two t("ib");
  const TimeNs t0 = t.lab->runtime().now_ns();
  t.lab->inject_async_event("a", E::PATH_MIG, t.qa->qp_num(), 7 * kNsPerMs);
  auto ev = t.a.ctx->get_async_event(t0 + kNsPerSec);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(t.lab->runtime().now_ns() - t0, 7 * kNsPerMs);
  EXPECT_EQ(t.qa->state(), QpState::RTS);  // PATH_MIG does not change the state
}

// seed 002: mana hands a freed QPN to the next create; a QP_FATAL still in the EQ when the old
// QP is destroyed must never reach the new one.
TEST(Events, ManaReusedQpnNeverGetsTheOldQpsEvent) {
  auto lab = lab_of({{"a", "mana"}});
  Node a = Node::on(*lab, "a");
  auto old_qp = a.qp();
  const uint32_t qpn = old_qp->qp_num();
  lab->inject_async_event("a", E::QP_FATAL, qpn, 10 * kNsPerMs);  // EQE waits 10 ms for the driver
  old_qp->destroy(lab->runtime().now_ns());
  auto new_qp = a.qp();
  EXPECT_EQ(new_qp->qp_num(), qpn);  // LIFO reuse
  EXPECT_NE(new_qp->id(), old_qp->id());
  EXPECT_TRUE(read_events(*lab, *a.ctx, 50 * kNsPerMs).empty());
  EXPECT_EQ(count_kind(*lab, "eqe_dropped"), 1u);
  EXPECT_EQ(new_qp->state(), QpState::RESET);
}

TEST(Events, VerbHookCanInjectDuringDestroy) {
  auto lab = lab_of({{"a", "mana"}});
  Node a = Node::on(*lab, "a");
  auto qp = a.qp();
  std::vector<std::string> verbs;
  lab->set_verb_hook([&](const VerbCall& c) {
    verbs.push_back(c.verb);
    if (c.verb == "ibv_destroy_qp")
      lab->inject_async_event(c.host, E::QP_FATAL, c.qp_num, kNsPerUs);
  });
  qp->destroy(lab->runtime().now_ns());
  EXPECT_EQ(verbs, std::vector<std::string>{"ibv_destroy_qp"});
  EXPECT_TRUE(read_events(*lab, *a.ctx, kNsPerMs).empty());
  EXPECT_EQ(count_kind(*lab, "eqe_dropped"), 1u);
}

TEST(Events, DeviceFatalErrorsEveryQpWithoutFlushAndLaterVerbsFailWithEio) {
  Two t("ib");
  t.qa->post_recv(recv_wr(1, *t.a.mr));
  t.lab->device_fatal("a");
  EXPECT_EQ(t.qa->state(), QpState::ERR);
  auto evs = read_events(*t.lab, *t.a.ctx);
  EXPECT_EQ(types_of(evs), (std::vector<E>{E::DEVICE_FATAL}));
  t.lab->run_for(kNsPerMs);
  EXPECT_TRUE(t.a.cq->poll(4).empty()) << "a dead device gives no flush completions";
  EXPECT_EQ(err_of([&] { t.qa->post_send(send_wr(1, *t.a.mr)); }), EIO);
  EXPECT_EQ(err_of([&] { t.a.ctx->alloc_pd(); }), EIO);
  EXPECT_EQ(t.a.ctx->query_port(1), PortState::DOWN);
  EXPECT_NO_THROW(t.qa->destroy(t.lab->runtime().now_ns()));
}

TEST(Events, PortEventsGoToEveryContextOfTheDevice) {
  auto lab = lab_of({{"a", "ib"}});
  Node one = Node::on(*lab, "a", "one");
  Node two = Node::on(*lab, "a", "two");
  lab->set_port_state("a", false);
  for (Node* n : {&one, &two}) {
    auto evs = read_events(*lab, *n->ctx);
    ASSERT_EQ(types_of(evs), (std::vector<E>{E::PORT_ERR}));
    EXPECT_EQ(evs[0].port_num, 1);
  }
}

TEST(Events, SrqDestroyWaitsForAcksAndRefusesWhileQpsUseIt) {
  auto lab = lab_of({{"a", "ib"}});
  Node a = Node::on(*lab, "a");
  auto srq = a.ctx->create_srq(*a.pd, SrqInitAttr{});
  auto qp = a.qp(QpType::RC, srq);
  EXPECT_EQ(err_of([&] { srq->destroy(0); }), EBUSY);  // a QP is attached
  qp->destroy(0);
  lab->inject_async_event("a", E::SRQ_ERR, srq->srq_num(), 0);
  auto ev = a.ctx->get_async_event(lab->runtime().now_ns() + kNsPerMs);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->srq_num, srq->srq_num());
  const TimeNs t0 = lab->runtime().now_ns();
  EXPECT_EQ(err_of([&] { srq->destroy(t0 + kNsPerMs); }), EBUSY);  // read, not acked
  EXPECT_EQ(lab->runtime().now_ns() - t0, kNsPerMs);                 // the caller's deadline
  EXPECT_FALSE(srq->destroyed());
  a.ctx->ack_async_event(*ev);
  srq->destroy(lab->runtime().now_ns());
  EXPECT_TRUE(srq->destroyed());
}

TEST(Events, EventReadAndAckAreRecorded) {
  Two t("ib");
  t.lab->inject_async_event("a", E::QP_FATAL, t.qa->qp_num(), 0);
  read_events(*t.lab, *t.a.ctx);
  EXPECT_EQ(count_kind(*t.lab, "async_event"), 1u);
  EXPECT_EQ(count_kind(*t.lab, "async_event_read"), 1u);
  EXPECT_EQ(count_kind(*t.lab, "async_event_ack"), 1u);
}

}  // namespace
}  // namespace events_test
}  // namespace rdmalab::model

namespace rdmalab::model {
namespace events_test {  // its own: the tests compile in batches
namespace {

// rdma link delete on mlx5 (disassociate_ucontext, Q3): DEVICE_FATAL to the user context, its
// QPs dead, the removal done at once; the context stays dead after rdma link add.
TEST(Removal, DisassociatingDeviceRaisesDeviceFatalAndCompletes) {
  Two t("ib");
  ASSERT_TRUE(t.a.ctx->caps().disassociates);
  t.lab->rdma_link_delete("a");
  EXPECT_TRUE(t.lab->host("a")->device_names().empty());
  EXPECT_FALSE(t.lab->rdma_link_removal_pending("a"));
  EXPECT_EQ(types_of(read_events(*t.lab, *t.a.ctx)), (std::vector<E>{E::DEVICE_FATAL}));
  EXPECT_EQ(t.qa->state(), QpState::ERR);
  EXPECT_EQ(err_of([&] { t.lab->host("a")->create_process("late")->open_device(""); }), ENODEV);
  t.lab->rdma_link_add("a");
  EXPECT_EQ(t.lab->host("a")->device_names().size(), 1u);
  EXPECT_EQ(err_of([&] { t.a.ctx->alloc_pd(); }), EIO);  // disassociated for good
  EXPECT_NO_THROW(t.lab->host("a")->create_process("new")->open_device("")->alloc_pd());
}

// rdma link delete on rxe (no disassociate_ucontext, Q3): nothing raised, the removal waits
// (wait_for_completion) until the last context on the device closes; add fails meanwhile.
TEST(Removal, NonDisassociatingDeviceWaitsForTheLastContext) {
  Two t("roce");
  ASSERT_FALSE(t.a.ctx->caps().disassociates);
  t.lab->rdma_link_delete("a");
  EXPECT_TRUE(t.lab->rdma_link_removal_pending("a"));
  EXPECT_TRUE(t.lab->host("a")->device_names().empty());
  t.lab->run_for(kNsPerSec);
  EXPECT_TRUE(read_events(*t.lab, *t.a.ctx).empty());
  EXPECT_EQ(t.qa->state(), QpState::RTS);
  EXPECT_EQ(err_of([&] { t.lab->rdma_link_add("a"); }), EBUSY);
  EXPECT_EQ(err_of([&] { t.lab->rdma_link_delete("a"); }), EBUSY);
  t.a.ctx->close();
  EXPECT_FALSE(t.lab->rdma_link_removal_pending("a"));
  t.lab->rdma_link_add("a");
  EXPECT_EQ(t.lab->host("a")->device_names().size(), 1u);
  EXPECT_EQ(err_of([&] { t.lab->rdma_link_add("a"); }), ENODEV);
}

TEST(Removal, SiwAndCxgb4CannotRaiseDeviceFatal) {
  for (const char* p : {"iwarp-siw", "iwarp-cxgb4", "roce", "mana"}) {
    Two t(p);
    EXPECT_FALSE(t.a.ctx->caps().disassociates) << p;
    EXPECT_EQ(err_of([&] { t.lab->device_fatal("a"); }), EOPNOTSUPP) << p;
  }
}

}  // namespace
}  // namespace events_test
}  // namespace rdmalab::model
