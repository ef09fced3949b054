// Posting rules per QP state and personality (IBA 10.3.1, semantics.md C and G), flush order,
// SQD and SQ_DRAINED, and bad arguments.
#include <gtest/gtest.h>

#include "model/test_util.h"

namespace rdmalab::model {
namespace posting_test {  // its own: the tests compile in batches
namespace {

using namespace testing;
using enum QpState;

struct Two {
  std::shared_ptr<ModelLab> lab;
  Node a, b;
  std::shared_ptr<Qp> qa, qb;
  explicit Two(const std::string& pers, QpCap cap = {}) {
    lab = lab_of({{"a", pers}, {"b", pers}});
    a = Node::on(*lab, "a");
    b = Node::on(*lab, "b");
    qa = a.qp(QpType::RC, nullptr, cap);
    qb = b.qp(QpType::RC, nullptr, cap);
  }
  void connect_both() { connect(*qa, *a.ctx, *qb, *b.ctx); }
};

TEST(Posting, ResetRefusesBothQueues) {
  Two t("ib");
  EXPECT_EQ(err_of([&] { t.qa->post_send(send_wr(1, *t.a.mr)); }), EINVAL);
  EXPECT_EQ(err_of([&] { t.qa->post_recv(recv_wr(1, *t.a.mr)); }), EINVAL);
}

TEST(Posting, InitAcceptsRecvRefusesSendAndRtrRefusesSend) {
  Two t("ib");
  to_init(*t.qb, ACCESS_LOCAL_WRITE);
  EXPECT_EQ(err_of([&] { t.qb->post_recv(recv_wr(1, *t.b.mr)); }), 0);
  EXPECT_EQ(err_of([&] { t.qb->post_send(send_wr(1, *t.b.mr)); }), EINVAL);
  // The peer sends while qb is still in INIT: nothing is processed, then RTR receives it.
  to_init(*t.qa, ACCESS_LOCAL_WRITE);
  to_rtr(*t.qa, t.b.ctx->query_gid(1, 0), t.qb->qp_num(), RcParams{});
  RcParams fast;
  fast.timeout = 8;
  to_rts(*t.qa, fast);
  t.qa->post_send(send_wr(5, *t.a.mr));
  t.lab->run_for(100 * kNsPerUs);
  EXPECT_TRUE(t.b.cq->poll(4).empty());
  to_rtr(*t.qb, t.a.ctx->query_gid(1, 0), t.qa->qp_num(), RcParams{});
  EXPECT_EQ(err_of([&] { t.qb->post_send(send_wr(2, *t.b.mr)); }), EINVAL);
  auto rw = wait_wcs(*t.lab, *t.b.cq, 1, 100 * kNsPerMs);  // after a retransmission
  ASSERT_EQ(rw.size(), 1u);
  EXPECT_EQ(rw[0].wr_id, 1u);
  EXPECT_EQ(rw[0].status, WcStatus::SUCCESS);
}

TEST(Posting, QueueFullIsEnomem) {
  QpCap cap;
  cap.max_send_wr = 2;
  cap.max_recv_wr = 1;
  Two t("ib", cap);
  t.connect_both();
  t.qa->post_send(send_wr(1, *t.a.mr));
  t.qa->post_send(send_wr(2, *t.a.mr));
  EXPECT_EQ(err_of([&] { t.qa->post_send(send_wr(3, *t.a.mr)); }), ENOMEM);
  t.qa->post_recv(recv_wr(1, *t.a.mr));
  EXPECT_EQ(err_of([&] { t.qa->post_recv(recv_wr(2, *t.a.mr)); }), ENOMEM);
}

TEST(Posting, FlushCompletesEveryOutstandingWrInPostingOrder) {
  Two t("ib");
  t.connect_both();
  t.lab->add_rule({{"action", "drop"}});
  for (uint64_t i = 1; i <= 4; ++i) t.qa->post_send(send_wr(i, *t.a.mr, 8, 0, i % 2 == 0));
  for (uint64_t i = 11; i <= 13; ++i) t.qa->post_recv(recv_wr(i, *t.a.mr));
  t.lab->run_for(10 * kNsPerUs);
  modify_state(*t.qa, ERR);
  auto wcs = wait_wcs(*t.lab, *t.a.cq, 7);
  ASSERT_EQ(wcs.size(), 7u);
  std::vector<uint64_t> send_ids, recv_ids;
  for (auto& wc : wcs) {
    EXPECT_EQ(wc.status, WcStatus::WR_FLUSH_ERR);
    EXPECT_EQ(wc.qp_num, t.qa->qp_num());
    (wc.wr_id > 10 ? recv_ids : send_ids).push_back(wc.wr_id);
  }
  EXPECT_EQ(send_ids, (std::vector<uint64_t>{1, 2, 3, 4}));  // unsignaled ones too
  EXPECT_EQ(recv_ids, (std::vector<uint64_t>{11, 12, 13}));
}

TEST(Posting, ErrPolicyPerPersonality) {
  for (const std::string pers : {"ib", "roce", "mana", "iwarp-cxgb4", "iwarp-siw"}) {
    Two t(pers);
    to_init(*t.qa, ACCESS_LOCAL_WRITE);
    modify_state(*t.qa, ERR);
    t.lab->run_for(kNsPerUs);
    const int err_send = err_of([&] { t.qa->post_send(send_wr(1, *t.a.mr)); });
    const int err_recv = err_of([&] { t.qa->post_recv(recv_wr(2, *t.a.mr)); });
    if (pers == "iwarp-cxgb4") {
      EXPECT_EQ(err_send, EINVAL) << pers;  // libcxgb4 refuses posts once in error
      EXPECT_EQ(err_recv, EINVAL) << pers;
      continue;
    }
    EXPECT_EQ(err_send, 0) << pers;
    EXPECT_EQ(err_recv, 0) << pers;
    auto now = t.a.cq->poll(4);
    if (pers == "iwarp-siw") {  // libsiw: in the mapped queues, and no system call flushes them
      t.lab->run_for(kNsPerSec);
      EXPECT_TRUE(t.a.cq->poll(4).empty()) << "a user siw post in ERROR is never completed";
      continue;
    } else {
      EXPECT_TRUE(now.empty()) << pers << ": the flush comes from the hardware, after the post";
      now = wait_wcs(*t.lab, *t.a.cq, 2);
      ASSERT_EQ(now.size(), 2u) << pers;
    }
    EXPECT_EQ(now[0].wr_id, 1u);
    EXPECT_EQ(now[0].status, WcStatus::WR_FLUSH_ERR);
    EXPECT_EQ(now[1].wr_id, 2u);
    EXPECT_EQ(now[1].status, WcStatus::WR_FLUSH_ERR);
  }
}

TEST(Posting, IbSqdAcceptsPostsAndProcessesThemBackInRts) {
  Two t("ib");
  t.connect_both();
  t.qb->post_recv(recv_wr(1, *t.b.mr));
  modify_state(*t.qa, SQD);
  EXPECT_EQ(err_of([&] { t.qa->post_send(send_wr(9, *t.a.mr)); }), 0);
  t.lab->run_for(kNsPerMs);
  EXPECT_TRUE(t.a.cq->poll(1).empty());
  modify_state(*t.qa, RTS);
  auto sw = wait_wcs(*t.lab, *t.a.cq, 1);
  ASSERT_EQ(sw.size(), 1u);
  EXPECT_EQ(sw[0].wr_id, 9u);
  EXPECT_EQ(sw[0].status, WcStatus::SUCCESS);
}

TEST(Posting, IwarpClosingPostsAndOutstandingWrsSendItToError) {
  for (const std::string pers : {"iwarp-cxgb4", "iwarp-siw"}) {
    Two t(pers);
    t.connect_both();
    t.qa->post_recv(recv_wr(7, *t.a.mr));
    modify_state(*t.qa, SQD);  // empty SQ: CLOSING
    EXPECT_EQ(t.qa->state(), SQD) << pers;
    // siw_qp_nextstate_from_rts, CLOSING: siw_rq_flush at once (vm:siw swarm seed 4); cxgb4
    // flushes only at ERROR.
    const auto at_closing = wait_wcs(*t.lab, *t.a.cq, 1);
    if (pers == "iwarp-siw") {
      ASSERT_EQ(at_closing.size(), 1u);
      EXPECT_EQ(at_closing[0].wr_id, 7u);
      EXPECT_EQ(at_closing[0].status, WcStatus::WR_FLUSH_ERR);
    } else {
      EXPECT_TRUE(at_closing.empty()) << pers;
    }
    // libsiw: the first SEND rings the doorbell, which siw_post_send answers -ENOTCONN; the
    // next finds its SQE still VALID, rings nothing and returns 0 (vm:siw, swarm seed 8).
    EXPECT_EQ(err_of([&] { t.qa->post_send(send_wr(1, *t.a.mr)); }),
              pers == "iwarp-siw" ? ENOTCONN : EINVAL) << pers;
    if (pers == "iwarp-siw") {
      EXPECT_EQ(err_of([&] { t.qa->post_send(send_wr(2, *t.a.mr)); }), 0) << pers;
    }
    // libsiw's post_recv writes the mapped RQ and asks no one (vm:siw, swarm seed 3).
    EXPECT_EQ(err_of([&] { t.qa->post_recv(recv_wr(3, *t.a.mr)); }),
              pers == "iwarp-siw" ? 0 : EINVAL) << pers;
    if (pers == "iwarp-siw") {  // to ERROR: siw_rq_flush takes the RECV, no flush the SENDs
      modify_state(*t.qa, ERR);
      const auto wcs = wait_wcs(*t.lab, *t.a.cq, 1);
      ASSERT_EQ(wcs.size(), 1u);
      EXPECT_EQ(wcs[0].wr_id, 3u);
      EXPECT_EQ(wcs[0].status, WcStatus::WR_FLUSH_ERR);
      t.lab->run_for(kNsPerSec);
      EXPECT_TRUE(t.a.cq->poll(4).empty()) << "a stranded SQE is never flushed";
    }
    // seed 000: CLOSING with WRs outstanding moves the QP to ERROR.
    t.lab->add_rule({{"action", "drop"}});
    t.qb->post_send(send_wr(2, *t.b.mr));
    modify_state(*t.qb, SQD);
    EXPECT_EQ(t.qb->state(), ERR) << pers;
  }
}

TEST(Posting, SqDrainedAfterOutstandingWrsComplete) {
  for (const std::string pers : {"ib", "roce", "iwarp-siw", "mana"}) {
    Two t(pers);
    t.connect_both();
    QpAttr a;
    a.en_sqd_async_notify = true;
    if (pers != "iwarp-siw") {
      t.qb->post_recv(recv_wr(1, *t.b.mr));
      t.qa->post_send(send_wr(1, *t.a.mr));
      t.lab->run_for(kNsPerUs);  // on the wire, not yet acknowledged
    }
    modify_state(*t.qa, SQD, QP_EN_SQD_ASYNC_NOTIFY, a);
    ASSERT_EQ(t.qa->state(), SQD);
    auto evs = read_events(*t.lab, *t.a.ctx, kNsPerMs);
    const bool raises = pers != "mana";
    ASSERT_EQ(evs.size(), raises ? 1u : 0u) << pers;
    if (!raises) continue;
    EXPECT_EQ(evs[0].type, AsyncEventType::SQ_DRAINED);
    EXPECT_EQ(evs[0].qp_num, t.qa->qp_num());
    EXPECT_EQ(evs[0].object_id, t.qa->id());
    if (pers != "iwarp-siw") {
      EXPECT_EQ(t.a.cq->poll(4).size(), 1u);  // the WR completed before the event
    }
  }
}

TEST(Posting, SendWhilePortDownIsLocQpOpErrOnRoce) {
  Two t("roce");
  t.connect_both();
  t.lab->set_port_state("a", false);
  EXPECT_EQ(t.a.ctx->query_port(1), PortState::DOWN);
  t.qa->post_send(send_wr(1, *t.a.mr));
  auto sw = wait_wcs(*t.lab, *t.a.cq, 1);
  ASSERT_EQ(sw.size(), 1u);
  EXPECT_EQ(sw[0].status, WcStatus::LOC_QP_OP_ERR);
  EXPECT_EQ(t.qa->state(), ERR);
  auto evs = types_of(read_events(*t.lab, *t.a.ctx));
  EXPECT_EQ(evs, std::vector<AsyncEventType>{AsyncEventType::PORT_ERR});
  t.lab->set_port_state("a", true);
  EXPECT_EQ(types_of(read_events(*t.lab, *t.a.ctx)),
            std::vector<AsyncEventType>{AsyncEventType::PORT_ACTIVE});
  EXPECT_EQ(t.lab->fault_counts()["port_down"], 1u);
}

TEST(Posting, PacketsToADownPortAreLostOnIb) {
  Two t("ib");
  RcParams rp;
  rp.timeout = 8;
  rp.retry_cnt = 2;
  connect(*t.qa, *t.a.ctx, *t.qb, *t.b.ctx, rp);
  t.lab->set_port_state("b", false);
  t.qa->post_send(send_wr(1, *t.a.mr));
  auto sw = wait_wcs(*t.lab, *t.a.cq, 1);
  ASSERT_EQ(sw.size(), 1u);
  EXPECT_EQ(sw[0].status, WcStatus::RETRY_EXC_ERR);
  EXPECT_GT(t.lab->fault_counts()["port_down_drop"], 0u);
}

TEST(Posting, BadArgumentsBehaveAsTheKernel) {
  Two t("ib");
  QpInitAttr a;
  a.pd = t.a.pd;
  a.recv_cq = t.a.cq;
  EXPECT_EQ(err_of([&] { t.a.ctx->create_qp(a); }), EINVAL);  // no send CQ
  a.send_cq = t.a.cq;
  a.cap.max_send_sge = 100;
  EXPECT_EQ(err_of([&] { t.a.ctx->create_qp(a); }), EINVAL);
  // Objects of another context are unknown handles here.
  a.cap = {};
  a.pd = t.b.pd;
  EXPECT_EQ(err_of([&] { t.a.ctx->create_qp(a); }), EINVAL);
  auto roce = lab_of({{"r", "roce"}, {"m", "mana"}});
  Node r = Node::on(*roce, "r");
  EXPECT_EQ(err_of([&] { r.qp(QpType::XRC_SEND); }), EOPNOTSUPP);
  EXPECT_EQ(err_of([&] { r.ctx->open_xrcd("", true, false); }), EOPNOTSUPP);
  Node m = Node::on(*roce, "m");
  EXPECT_EQ(err_of([&] { m.ctx->create_srq(*m.pd, SrqInitAttr{}); }), EOPNOTSUPP);
  auto iw = lab_of({{"w", "iwarp-siw"}});
  Node w = Node::on(*iw, "w");
  EXPECT_EQ(err_of([&] { w.qp(QpType::UD); }), EOPNOTSUPP);
}

TEST(Posting, UsingADestroyedObjectIsEbadf) {
  Two t("ib");
  t.qa->destroy(t.lab->runtime().now_ns());
  EXPECT_TRUE(t.qa->destroyed());
  EXPECT_EQ(err_of([&] { t.qa->post_send(send_wr(1, *t.a.mr)); }), EBADF);
  EXPECT_EQ(err_of([&] { t.qa->modify(QpAttr{}, QP_STATE); }), EBADF);
  EXPECT_EQ(err_of([&] { t.qa->destroy(0); }), EBADF);
  EXPECT_EQ(err_of([&] { t.a.cq->destroy(0); }), 0);
  EXPECT_EQ(err_of([&] { t.a.cq->poll(1); }), EBADF);
  EXPECT_EQ(err_of([&] { t.a.pd->dealloc(); }), EBUSY);  // the MR still uses it
  t.a.mr->dereg();
  EXPECT_EQ(err_of([&] { t.a.mr->read(0, 1); }), EBADF);
  t.a.pd->dealloc();
  EXPECT_EQ(err_of([&] { t.a.ctx->reg_mr(*t.a.pd, 16, 0); }), EBADF);
}

TEST(Posting, CqInUseCannotBeDestroyed) {
  Two t("ib");
  EXPECT_EQ(err_of([&] { t.a.cq->destroy(0); }), EBUSY);
  EXPECT_FALSE(t.a.cq->destroyed());
}

TEST(Posting, PostsAreRecordedWithTheirSignaledFlag) {
  Two t("ib");
  t.connect_both();
  t.qa->post_send(send_wr(42, *t.a.mr, 8, 0, false));
  bool found = false;
  for (const auto& r : t.lab->history().snapshot()) {
    if (r.kind == "post" && r.data["wr_id"] == 42) {
      found = true;
      EXPECT_EQ(r.data["queue"], "send");
      EXPECT_EQ(r.data["signaled"], false);
      EXPECT_EQ(r.object, t.qa->label());
      EXPECT_EQ(r.host, "a");
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace posting_test
}  // namespace rdmalab::model
