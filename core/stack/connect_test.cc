// bring_up: the attribute table, and RC QPs brought up on the model that then carry a SEND.
#include "stack/connect.h"

#include <gtest/gtest.h>

#include "rdmalab/error.h"
#include "stack/ledger.h"
#include "stack/test_lab.h"
#include "stack/traffic.h"

namespace rdmalab::stack {
namespace {

TEST(ConnectTest, MasksFollowQpTypeAndTransport) {
  const auto rc = transition_masks(QpType::RC, Transport::IB);
  EXPECT_EQ(rc.to_init, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS);
  EXPECT_EQ(rc.to_rtr, QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN |
                           QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER);
  EXPECT_EQ(rc.to_rts,
            QP_STATE | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN | QP_MAX_QP_RD_ATOMIC);
  const auto ud = transition_masks(QpType::UD, Transport::RoCE);
  EXPECT_EQ(ud.to_init, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_QKEY);
  EXPECT_EQ(ud.to_rtr, uint32_t{QP_STATE});
  EXPECT_EQ(ud.to_rts, QP_STATE | QP_SQ_PSN);
  const auto xsend = transition_masks(QpType::XRC_SEND, Transport::IB);
  EXPECT_EQ(xsend.to_rtr, QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN);
  EXPECT_EQ(xsend.to_rts, rc.to_rts);
  const auto xrecv = transition_masks(QpType::XRC_RECV, Transport::IB);
  EXPECT_EQ(xrecv.to_rtr, rc.to_rtr);
  EXPECT_EQ(xrecv.to_rts, 0u);  // stops at RTR
  const auto iw = transition_masks(QpType::RC, Transport::iWARP);
  EXPECT_EQ(iw.to_init, QP_STATE | QP_ACCESS_FLAGS);
  EXPECT_EQ(iw.to_rtr, QP_STATE | QP_ACCESS_FLAGS);
  EXPECT_EQ(iw.to_rts, uint32_t{QP_STATE});
}

TEST(ConnectTest, AttrCarriesBothEndpoints) {
  Endpoint local{17, 100, {}, 0, Transport::IB, 1};
  Endpoint remote{42, 200, {}, 0, Transport::IB, 1};
  remote.gid.raw[15] = 9;
  const QpAttr a = bring_up_attr(local, remote, RcParams{});
  EXPECT_EQ(a.dest_qp_num, 42u);
  EXPECT_EQ(a.rq_psn, 200u);
  EXPECT_EQ(a.sq_psn, 100u);
  EXPECT_EQ(a.ah_attr.dgid, remote.gid);
}

class ConnectModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ConnectModelTest, RcBringUpCarriesSend) {
  fixture::TwoHosts lab(GetParam());
  auto [qa, qb] = lab.connected_pair();
  EXPECT_EQ(qa->state(), QpState::RTS);
  EXPECT_EQ(qb->state(), QpState::RTS);
  EXPECT_EQ(qa->query().dest_qp_num, qb->qp_num());

  CompletionLedger ledger(&lab.history());
  Traffic traffic(lab.rt(), ledger, &lab.history());
  lab.a.mr->write(0, {1, 2, 3, 4, 5, 6, 7, 8});
  traffic.post_recv(*qb, fixture::TwoHosts::recv_wr(lab.b, 64, 128));
  traffic.post_send(*qa, fixture::TwoHosts::send_wr(lab.a, 8));
  ASSERT_TRUE(traffic.wait_completions(*lab.a.cq, 1, lab.in(kNsPerSec)));
  ASSERT_TRUE(traffic.wait_completions(*lab.b.cq, 1, lab.in(kNsPerSec)));
  for (const auto& wc : traffic.completions()) EXPECT_EQ(wc.status, WcStatus::SUCCESS);
  EXPECT_EQ(lab.b.mr->read(128, 8), (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  const LedgerReport r = ledger.check();
  EXPECT_TRUE(r.exactly_once());
  EXPECT_EQ(r.succeeded, 2u);
}

TEST_P(ConnectModelTest, BringUpFromWrongStatePropagatesError) {
  fixture::TwoHosts lab(GetParam());
  auto [qa, qb] = lab.connected_pair();
  const Endpoint ea = local_endpoint(*lab.a.ctx, *qa, 1);
  const Endpoint eb = local_endpoint(*lab.b.ctx, *qb, 2);
  try {
    bring_up(*qa, ea, eb);  // RTS -> INIT is not in qp_state_table
    FAIL() << "bring_up from RTS succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EINVAL);
    EXPECT_EQ(e.verb(), "ibv_modify_qp");
  }
}

// iWARP QPs get their peer from bring_up's stand-in for the iWARP connection (connect.cc).
INSTANTIATE_TEST_SUITE_P(Personalities, ConnectModelTest,
                         ::testing::Values("ib", "roce", "mana", "iwarp-cxgb4", "iwarp-siw"));

std::vector<std::string> modify_masks(History& h, const std::string& label) {
  std::vector<std::string> masks;
  for (const auto& r : h.snapshot()) {
    if (r.object == label && r.kind == "verb" && r.data.value("verb", "") == "ibv_modify_qp") {
      masks.push_back(r.data.value("mask", ""));
    }
  }
  return masks;
}

class ConnectIwarpTest : public ::testing::TestWithParam<std::string> {};

// iw_cm_init_qp_attr's masks, plus only the peer binding the connection would supply.
TEST_P(ConnectIwarpTest, BringUpUsesIwCmInitQpAttrMasks) {
  fixture::TwoHosts lab(GetParam());
  auto qp = lab.create_rc(lab.a);
  auto peer = lab.create_rc(lab.b);
  const Endpoint local = local_endpoint(*lab.a.ctx, *qp, 1);
  EXPECT_EQ(local.transport, Transport::iWARP);
  bring_up(*qp, local, local_endpoint(*lab.b.ctx, *peer, 2));
  EXPECT_EQ(qp->state(), QpState::RTS);
  const auto masks = modify_masks(lab.history(), qp->label());
  ASSERT_EQ(masks.size(), 3u);
  EXPECT_EQ(masks[0], "QP_STATE|QP_ACCESS_FLAGS");
  EXPECT_EQ(masks[1], "QP_STATE|QP_ACCESS_FLAGS|QP_AV|QP_RQ_PSN|QP_DEST_QPN");
  EXPECT_EQ(masks[2], "QP_STATE|QP_SQ_PSN");
  for (const auto& m : masks) {
    EXPECT_EQ(m.find("QP_PATH_MTU"), std::string::npos) << m;
    EXPECT_EQ(m.find("QP_TIMEOUT"), std::string::npos) << m;
    EXPECT_EQ(m.find("QP_MIN_RNR_TIMER"), std::string::npos) << m;
  }
  EXPECT_NE(masks[0].find("QP_ACCESS_FLAGS"), std::string::npos) << masks[0];
  EXPECT_EQ(masks[2].find("QP_ACCESS_FLAGS"), std::string::npos) << masks[2];
}

INSTANTIATE_TEST_SUITE_P(Personalities, ConnectIwarpTest,
                         ::testing::Values("iwarp-cxgb4", "iwarp-siw"));

TEST(ConnectModelTest, UdQpReachesRts) {
  fixture::TwoHosts lab("roce");
  QpInitAttr attr;
  attr.qp_type = QpType::UD;
  attr.pd = lab.a.pd;
  attr.send_cq = lab.a.cq;
  attr.recv_cq = lab.a.cq;
  auto qp = lab.a.ctx->create_qp(attr);
  const Endpoint ep = local_endpoint(*lab.a.ctx, *qp, 7);
  bring_up(*qp, ep, Endpoint{}, RcParams{});
  EXPECT_EQ(qp->state(), QpState::RTS);
  EXPECT_EQ(qp->query().qkey, RcParams{}.qkey);
}

}  // namespace
}  // namespace rdmalab::stack
