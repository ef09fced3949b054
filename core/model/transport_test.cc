// RC and UD traffic on the model: bytes move, loss and retransmission, RETRY_EXC_ERR timing,
// RNR, remote access errors (IBA 9.7).
#include "model/transport.h"

#include <gtest/gtest.h>

#include "model/test_util.h"

namespace rdmalab::model {
namespace {

using namespace testing;

struct Pair {
  std::shared_ptr<ModelLab> lab;
  Node a, b;
  std::shared_ptr<Qp> qa, qb;

  static Pair rc(const std::string& pers, const RcParams& p = {}, uint64_t seed = 1) {
    Pair x;
    x.lab = lab_of({{"a", pers}, {"b", pers}}, seed);
    x.a = Node::on(*x.lab, "a");
    x.b = Node::on(*x.lab, "b");
    x.qa = x.a.qp();
    x.qb = x.b.qp();
    connect(*x.qa, *x.a.ctx, *x.qb, *x.b.ctx, p);
    return x;
  }
};

// How many packets a wire-fault rule took (ModelLab::rules).
uint64_t acted(const ModelLab& lab, uint64_t rule_id) {
  for (const auto& r : lab.rules())
    if (r.at("id") == rule_id) return r.at("acted").get<uint64_t>();
  ADD_FAILURE() << "no rule " << rule_id;
  return 0;
}

const nlohmann::json kDropAll = {{"action", "drop"}};

TEST(Transport, SendMovesBytesAndCompletesBothSides) {
  Pair p = Pair::rc("ib");
  p.a.mr->write(0, bytes("hello, model"));
  p.qb->post_recv(recv_wr(7, *p.b.mr, 256, 100));
  p.qa->post_send(send_wr(1, *p.a.mr, 12));
  auto sw = wait_wcs(*p.lab, *p.a.cq, 1);
  auto rw = wait_wcs(*p.lab, *p.b.cq, 1);
  ASSERT_EQ(sw.size(), 1u);
  ASSERT_EQ(rw.size(), 1u);
  EXPECT_EQ(sw[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(sw[0].opcode, WcOpcode::SEND);
  EXPECT_EQ(sw[0].qp_num, p.qa->qp_num());
  EXPECT_EQ(rw[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(rw[0].wr_id, 7u);
  EXPECT_EQ(rw[0].opcode, WcOpcode::RECV);
  EXPECT_EQ(rw[0].byte_len, 12u);
  EXPECT_EQ(p.b.mr->read(100, 12), bytes("hello, model"));
}

TEST(Transport, RdmaWriteWithImmAndReadMoveBytes) {
  Pair p = Pair::rc("roce");
  p.a.mr->write(0, bytes("written"));
  SendWr w = send_wr(1, *p.a.mr, 7);
  w.opcode = WrOpcode::RDMA_WRITE;
  w.remote_addr = p.b.mr->addr() + 2000;
  w.rkey = p.b.mr->rkey();
  p.qa->post_send(w);
  p.b.mr->write(3000, bytes("to be read"));
  SendWr r = send_wr(2, *p.a.mr, 10, 500);
  r.opcode = WrOpcode::RDMA_READ;
  r.remote_addr = p.b.mr->addr() + 3000;
  r.rkey = p.b.mr->rkey();
  p.qa->post_send(r);
  p.qb->post_recv(recv_wr(9, *p.b.mr, 0));
  SendWr wi = send_wr(3, *p.a.mr, 7);
  wi.opcode = WrOpcode::RDMA_WRITE_WITH_IMM;
  wi.imm_data = 0xabcd;
  wi.remote_addr = p.b.mr->addr() + 2100;
  wi.rkey = p.b.mr->rkey();
  p.qa->post_send(wi);
  auto sw = wait_wcs(*p.lab, *p.a.cq, 3);
  ASSERT_EQ(sw.size(), 3u);
  EXPECT_EQ(sw[0].opcode, WcOpcode::RDMA_WRITE);
  EXPECT_EQ(sw[1].opcode, WcOpcode::RDMA_READ);
  EXPECT_EQ(sw[1].byte_len, 10u);
  for (auto& wc : sw) EXPECT_EQ(wc.status, WcStatus::SUCCESS);
  EXPECT_EQ(p.b.mr->read(2000, 7), bytes("written"));
  EXPECT_EQ(p.b.mr->read(2100, 7), bytes("written"));
  EXPECT_EQ(p.a.mr->read(500, 10), bytes("to be read"));
  auto rw = wait_wcs(*p.lab, *p.b.cq, 1);
  ASSERT_EQ(rw.size(), 1u);
  EXPECT_EQ(rw[0].opcode, WcOpcode::RECV_RDMA_WITH_IMM);
  EXPECT_TRUE(rw[0].with_imm);
  EXPECT_EQ(rw[0].imm_data, 0xabcdu);
}

TEST(Transport, UnsignaledSuccessProducesNoCompletion) {
  Pair p = Pair::rc("ib");
  for (int i = 0; i < 3; ++i) p.qb->post_recv(recv_wr(i, *p.b.mr));
  p.qa->post_send(send_wr(1, *p.a.mr, 8, 0, false));
  p.qa->post_send(send_wr(2, *p.a.mr, 8, 0, true));
  p.qa->post_send(send_wr(3, *p.a.mr, 8, 0, false));
  EXPECT_EQ(wait_wcs(*p.lab, *p.b.cq, 3).size(), 3u);
  p.lab->run_for(kNsPerMs);
  auto sw = p.a.cq->poll(16);
  ASSERT_EQ(sw.size(), 1u);
  EXPECT_EQ(sw[0].wr_id, 2u);
}

TEST(Transport, DroppedPacketsAreRetransmittedAfterTheAckTimeout) {
  RcParams rp;
  rp.timeout = 10;  // 4.096 us * 2^10 = 4.19 ms
  rp.retry_cnt = 3;
  Pair p = Pair::rc("ib", rp);
  p.lab->add_rule({{"action", "drop"}, {"opcode", "SEND_ONLY"}, {"count", 2}});
  p.qb->post_recv(recv_wr(1, *p.b.mr));
  const TimeNs t0 = p.lab->runtime().now_ns();
  p.qa->post_send(send_wr(1, *p.a.mr));
  auto sw = wait_wcs(*p.lab, *p.a.cq, 1);
  ASSERT_EQ(sw.size(), 1u);
  EXPECT_EQ(sw[0].status, WcStatus::SUCCESS);
  EXPECT_GE(p.lab->runtime().now_ns() - t0, 2 * ack_timeout_ns(10));
  EXPECT_EQ(p.lab->fault_counts()["drop"], 2u);
  EXPECT_EQ(count_kind(*p.lab, "retransmit"), 2u);
}

TEST(Transport, DropEverythingEndsInRetryExcErrAfterRetryCntPlusOneTimeouts) {
  RcParams rp;
  rp.timeout = 12;
  rp.retry_cnt = 3;
  Pair p = Pair::rc("ib", rp);
  p.lab->add_rule(kDropAll);
  const TimeNs t0 = p.lab->runtime().now_ns();
  p.qa->post_send(send_wr(1, *p.a.mr, 8, 0, false));  // unsignaled: errors complete anyway
  p.qa->post_send(send_wr(2, *p.a.mr));
  auto sw = wait_wcs(*p.lab, *p.a.cq, 2, 10 * kNsPerSec);
  ASSERT_EQ(sw.size(), 2u);
  EXPECT_EQ(sw[0].wr_id, 1u);
  EXPECT_EQ(sw[0].status, WcStatus::RETRY_EXC_ERR);
  EXPECT_EQ(sw[1].wr_id, 2u);
  EXPECT_EQ(sw[1].status, WcStatus::WR_FLUSH_ERR);
  const TimeNs bound = (rp.retry_cnt + 1) * ack_timeout_ns(rp.timeout);
  const TimeNs took = p.lab->runtime().now_ns() - t0;
  EXPECT_GE(took, bound);
  EXPECT_LE(took, bound + 10 * kNsPerUs);
  EXPECT_EQ(p.qa->state(), QpState::ERR);
}

TEST(Transport, RetryCnt7IsFiniteOnIbAndInfiniteOnRoce) {
  for (const std::string pers : {"ib", "roce"}) {
    RcParams rp;
    rp.timeout = 8;  // ~1 ms
    rp.retry_cnt = 7;
    Pair p = Pair::rc(pers, rp);
    p.lab->add_rule(kDropAll);
    p.qa->post_send(send_wr(1, *p.a.mr));
    auto sw = wait_wcs(*p.lab, *p.a.cq, 1, 10 * kNsPerSec);
    if (pers == "ib") {
      ASSERT_EQ(sw.size(), 1u);
      EXPECT_EQ(sw[0].status, WcStatus::RETRY_EXC_ERR);
    } else {
      EXPECT_TRUE(sw.empty()) << "rxe treats retry_cnt 7 as infinite";
      EXPECT_EQ(p.qa->state(), QpState::RTS);
    }
  }
}

TEST(Transport, PacketToAQpnWithNoQpEndsInRetryExcErr) {
  RcParams rp;
  rp.timeout = 8;
  rp.retry_cnt = 1;
  Pair p = Pair::rc("ib", rp);
  p.qb->destroy(p.lab->runtime().now_ns());
  p.qa->post_send(send_wr(1, *p.a.mr));
  auto sw = wait_wcs(*p.lab, *p.a.cq, 1);
  ASSERT_EQ(sw.size(), 1u);
  EXPECT_EQ(sw[0].status, WcStatus::RETRY_EXC_ERR);
}

TEST(Transport, RnrNakIsRetriedAfterMinRnrTimerUntilARecvIsPosted) {
  RcParams rp;
  rp.min_rnr_timer = 14;  // 1.28 ms
  rp.rnr_retry = 3;
  Pair p = Pair::rc("ib", rp);
  p.qa->post_send(send_wr(1, *p.a.mr));
  p.lab->run_for(2 * kNsPerMs);  // one RNR NAK and one retry so far
  EXPECT_TRUE(p.a.cq->poll(1).empty());
  p.qb->post_recv(recv_wr(5, *p.b.mr));
  auto sw = wait_wcs(*p.lab, *p.a.cq, 1);
  ASSERT_EQ(sw.size(), 1u);
  EXPECT_EQ(sw[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(rnr_timer_ns(14), 1280 * kNsPerUs);
  EXPECT_EQ(rnr_timer_ns(0), 655360 * kNsPerUs);
}

TEST(Transport, RnrRetryExhaustionAfterRnrRetryPlusOneNaks) {
  RcParams rp;
  rp.min_rnr_timer = 1;  // 10 us
  rp.rnr_retry = 2;
  Pair p = Pair::rc("roce", rp);
  const uint64_t naks = p.lab->add_rule({{"action", "watch"}, {"syndrome", "RNR_NAK"}});
  p.qa->post_send(send_wr(1, *p.a.mr));
  p.qa->post_send(send_wr(2, *p.a.mr));
  auto sw = wait_wcs(*p.lab, *p.a.cq, 2);
  ASSERT_EQ(sw.size(), 2u);
  EXPECT_EQ(sw[0].status, WcStatus::RNR_RETRY_EXC_ERR);
  EXPECT_EQ(sw[1].status, WcStatus::WR_FLUSH_ERR);
  EXPECT_EQ(acted(*p.lab, naks), 3u);
  EXPECT_EQ(p.qa->state(), QpState::ERR);
}

TEST(Transport, RnrRetry7IsInfinite) {
  RcParams rp;
  rp.min_rnr_timer = 1;
  rp.rnr_retry = 7;
  Pair p = Pair::rc("ib", rp);
  p.qa->post_send(send_wr(1, *p.a.mr));
  EXPECT_TRUE(wait_wcs(*p.lab, *p.a.cq, 1, 100 * kNsPerMs).empty());
  EXPECT_EQ(p.qa->state(), QpState::RTS);
}

TEST(Transport, GapGetsOneNakSeqAndGoBackN) {
  Pair p = Pair::rc("ib");
  for (int i = 0; i < 4; ++i) p.qb->post_recv(recv_wr(i, *p.b.mr));
  const uint64_t nak_seq = p.lab->add_rule({{"action", "watch"}, {"syndrome", "NAK_SEQ"}});
  p.lab->add_rule({{"action", "drop"}, {"opcode", "SEND_ONLY"}, {"psn", 0}, {"count", 1}});
  for (int i = 0; i < 4; ++i) p.qa->post_send(send_wr(10 + i, *p.a.mr));
  auto sw = wait_wcs(*p.lab, *p.a.cq, 4, 10 * kNsPerMs);  // well before the 67 ms ACK timeout
  ASSERT_EQ(sw.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(sw[i].wr_id, 10u + i);
    EXPECT_EQ(sw[i].status, WcStatus::SUCCESS);
  }
  EXPECT_EQ(acted(*p.lab, nak_seq), 1u);
  EXPECT_EQ(wait_wcs(*p.lab, *p.b.cq, 4).size(), 4u);  // each message delivered exactly once
}

TEST(Transport, DuplicatedPacketsAreDeliveredOnce) {
  Pair p = Pair::rc("ib");
  p.lab->add_rule({{"action", "duplicate"}});
  for (int i = 0; i < 3; ++i) p.qb->post_recv(recv_wr(i, *p.b.mr));
  for (int i = 0; i < 2; ++i) p.qa->post_send(send_wr(i, *p.a.mr));
  EXPECT_EQ(wait_wcs(*p.lab, *p.a.cq, 2).size(), 2u);
  p.lab->run_for(kNsPerMs);
  EXPECT_EQ(p.b.cq->poll(16).size(), 2u);
  EXPECT_GT(p.lab->fault_counts()["duplicate"], 0u);
}

// A reordered SEND reaches the responder after the next one: a sequence gap (one NAK_SEQ,
// go-back-N), each message still delivered once and in order; the same seed replays it.
TEST(Transport, ReorderedSendIsOneNakSeqAndTheSameSeedReplaysIt) {
  auto run = [](std::string* history) {
    Pair p = Pair::rc("ib");
    for (int i = 0; i < 2; ++i) p.qb->post_recv(recv_wr(i, *p.b.mr, 64, 64 * i));
    const uint64_t nak_seq = p.lab->add_rule({{"action", "watch"}, {"syndrome", "NAK_SEQ"}});
    p.lab->add_rule(
        {{"action", "reorder"}, {"opcode", "SEND_ONLY"}, {"count", 1}, {"hold_ns", kNsPerSec}});
    p.a.mr->write(0, bytes("first"));
    p.a.mr->write(64, bytes("second"));
    p.qa->post_send(send_wr(10, *p.a.mr, 5));
    p.qa->post_send(send_wr(11, *p.a.mr, 6, 64));
    auto sw = wait_wcs(*p.lab, *p.a.cq, 2, 10 * kNsPerMs);  // well before the ACK timeout
    auto rw = wait_wcs(*p.lab, *p.b.cq, 2, kNsPerMs);
    EXPECT_EQ(acted(*p.lab, nak_seq), 1u);
    EXPECT_EQ(p.lab->fault_counts()["reorder"], 1u);
    EXPECT_EQ(count_kind(*p.lab, "reorder_release"), 1u);
    EXPECT_EQ(sw.size(), 2u);
    for (const auto& wc : sw) EXPECT_EQ(wc.status, WcStatus::SUCCESS);
    EXPECT_EQ(rw.size(), 2u);
    EXPECT_EQ(p.b.mr->read(0, 5), bytes("first"));
    EXPECT_EQ(p.b.mr->read(64, 6), bytes("second"));
    p.lab->run_for(kNsPerMs);
    EXPECT_TRUE(p.b.cq->poll(16).empty());  // no message twice
    *history = p.lab->history().to_jsonl();
  };
  std::string first, second;
  run(&first);
  run(&second);
  EXPECT_EQ(first, second);
}

TEST(Transport, BadRkeyIsRemAccessErrAndBothQpsGoToErr) {
  for (const std::string pers : {"ib", "roce"}) {
    Pair p = Pair::rc(pers);
    SendWr w = send_wr(1, *p.a.mr, 8);
    w.opcode = WrOpcode::RDMA_WRITE;
    w.rkey = p.b.mr->rkey() + 77;
    p.qa->post_send(w);
    auto sw = wait_wcs(*p.lab, *p.a.cq, 1);
    ASSERT_EQ(sw.size(), 1u);
    EXPECT_EQ(sw[0].status, WcStatus::REM_ACCESS_ERR);
    EXPECT_EQ(p.qa->state(), QpState::ERR);
    EXPECT_EQ(p.qb->state(), QpState::ERR);
    auto evs = types_of(read_events(*p.lab, *p.b.ctx));
    if (pers == "ib") {
      EXPECT_EQ(evs, std::vector<AsyncEventType>{AsyncEventType::QP_ACCESS_ERR});
    } else {
      EXPECT_TRUE(evs.empty()) << "rxe raises no event for a bad rkey (vmlab.md)";
    }
  }
}

TEST(Transport, WriteWithoutRemoteWriteAccessIsRemAccessErr) {
  RcParams rp;
  rp.access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ;  // the QP allows no remote write
  Pair p = Pair::rc("ib", rp);
  SendWr w = send_wr(1, *p.a.mr, 8);
  w.opcode = WrOpcode::RDMA_WRITE;
  w.rkey = p.b.mr->rkey();
  p.qa->post_send(w);
  auto sw = wait_wcs(*p.lab, *p.a.cq, 1);
  ASSERT_EQ(sw.size(), 1u);
  EXPECT_EQ(sw[0].status, WcStatus::REM_ACCESS_ERR);
}

TEST(Transport, LkeyMismatchIsLocProtErrCompletionNotAnException) {
  Pair p = Pair::rc("ib");
  SendWr w = send_wr(1, *p.a.mr, 8);
  w.sg_list[0].lkey = 0xdead;
  EXPECT_NO_THROW(p.qa->post_send(w));
  p.qa->post_send(send_wr(2, *p.a.mr));
  auto sw = wait_wcs(*p.lab, *p.a.cq, 2);
  ASSERT_EQ(sw.size(), 2u);
  EXPECT_EQ(sw[0].status, WcStatus::LOC_PROT_ERR);
  EXPECT_EQ(sw[1].status, WcStatus::WR_FLUSH_ERR);
  SendWr oob = send_wr(3, *p.a.mr, 100, 4090);  // past the end of the MR
  Pair q = Pair::rc("ib");
  oob.sg_list[0].lkey = q.a.mr->lkey();
  q.qa->post_send(oob);
  auto sw2 = wait_wcs(*q.lab, *q.a.cq, 1);
  ASSERT_EQ(sw2.size(), 1u);
  EXPECT_EQ(sw2[0].status, WcStatus::LOC_PROT_ERR);
}

TEST(Transport, MessageLongerThanRecvBufferIsLocLenErrAndRemInvReq) {
  Pair p = Pair::rc("ib");
  p.qb->post_recv(recv_wr(1, *p.b.mr, 4));
  p.qa->post_send(send_wr(1, *p.a.mr, 32));
  auto rw = wait_wcs(*p.lab, *p.b.cq, 1);
  auto sw = wait_wcs(*p.lab, *p.a.cq, 1);
  ASSERT_EQ(rw.size(), 1u);
  ASSERT_EQ(sw.size(), 1u);
  EXPECT_EQ(rw[0].status, WcStatus::LOC_LEN_ERR);
  EXPECT_EQ(sw[0].status, WcStatus::REM_INV_REQ_ERR);
}

TEST(Transport, UdDeliversOnMatchingQkeyWithGrhRoom) {
  auto lab = lab_of({{"a", "roce"}, {"b", "roce"}});
  Node a = Node::on(*lab, "a");
  Node b = Node::on(*lab, "b");
  auto ua = a.qp(QpType::UD);
  auto ub = b.qp(QpType::UD);
  for (auto* q : {ua.get(), ub.get()}) {
    QpAttr at;
    at.qp_state = QpState::INIT;
    at.port_num = 1;
    at.qkey = 0x1234;
    q->modify(at, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_QKEY);
    modify_state(*q, QpState::RTR);
    modify_state(*q, QpState::RTS, QP_SQ_PSN);
  }
  ub->post_recv(recv_wr(1, *b.mr, 256));
  ub->post_recv(recv_wr(2, *b.mr, 256, 512));
  a.mr->write(0, bytes("datagram"));
  SendWr w = send_wr(1, *a.mr, 8);
  w.ah = AhAttr{};
  w.ah->dgid = b.ctx->query_gid(1, 0);
  w.remote_qpn = ub->qp_num();
  w.remote_qkey = 0x9999;  // wrong Q_Key: dropped
  ua->post_send(w);
  w.wr_id = 2;
  w.remote_qkey = 0x1234;
  ua->post_send(w);
  auto sw = wait_wcs(*lab, *a.cq, 2);
  ASSERT_EQ(sw.size(), 2u);
  EXPECT_EQ(sw[0].status, WcStatus::SUCCESS);  // UD completes on the wire, delivered or not
  auto rw = wait_wcs(*lab, *b.cq, 1);
  ASSERT_EQ(rw.size(), 1u);
  EXPECT_EQ(rw[0].wr_id, 1u);
  EXPECT_EQ(rw[0].byte_len, 8u + 40u);
  EXPECT_EQ(rw[0].src_qp, ua->qp_num());
  EXPECT_EQ(b.mr->read(40, 8), bytes("datagram"));
  SendWr bad = w;
  bad.opcode = WrOpcode::RDMA_WRITE;
  EXPECT_EQ(err_of([&] { ua->post_send(bad); }), EINVAL);
}

TEST(Transport, LossPpmIsSeededAndCounted) {
  auto run = [](uint64_t seed) {
    RcParams rp;
    rp.timeout = 6;
    Pair p = Pair::rc("ib", rp, seed);
    p.lab->set_fabric(FabricOptions{2 * kNsPerUs, 1 * kNsPerUs, 200000});
    for (int i = 0; i < 12; ++i) p.qb->post_recv(recv_wr(i, *p.b.mr));
    for (int i = 0; i < 12; ++i) p.qa->post_send(send_wr(i, *p.a.mr));
    auto sw = wait_wcs(*p.lab, *p.a.cq, 12, 10 * kNsPerSec);
    EXPECT_EQ(sw.size(), 12u);
    for (auto& wc : sw) EXPECT_EQ(wc.status, WcStatus::SUCCESS);
    return p.lab->fault_counts()["drop"];
  };
  const uint64_t d1 = run(5);
  EXPECT_GT(d1, 0u);
  EXPECT_EQ(run(5), d1);
}

}  // namespace
}  // namespace rdmalab::model
