// The QP state machine table (semantics.md G) and modify on a model QP.
#include "model/qp_state_table.h"

#include <gtest/gtest.h>

#include <set>

#include "model/test_util.h"

namespace rdmalab::model {
namespace qp_state_table_test {  // its own: the tests compile in batches
namespace {

using namespace testing;
using enum QpState;

constexpr QpState kAll[] = {RESET, INIT, RTR, RTS, SQD, SQE, ERR};

TEST(QpStateTable, ValidTransitionsAreExactlyTheKernelTable) {
  const std::set<std::pair<QpState, QpState>> valid = {
      {RESET, RESET}, {RESET, INIT}, {INIT, INIT}, {INIT, RTR},  {INIT, RESET}, {INIT, ERR},
      {RTR, RTS},     {RTR, RESET},  {RTR, ERR},   {RTS, RTS},   {RTS, SQD},    {RTS, RESET},
      {RTS, ERR},     {SQD, RTS},    {SQD, SQD},   {SQD, RESET}, {SQD, ERR},    {SQE, RTS},
      {SQE, RESET},   {SQE, ERR},    {ERR, RESET}, {ERR, ERR}};
  for (QpState from : kAll) {
    for (QpState to : kAll) {
      for (QpType t : {QpType::RC, QpType::UD, QpType::XRC_SEND, QpType::XRC_RECV}) {
        EXPECT_EQ(transition_rule(from, to, t).valid, valid.count({from, to}) == 1)
            << to_string(from) << "->" << to_string(to) << " " << to_string(t);
      }
    }
  }
  EXPECT_FALSE(transition_rule(RESET, ERR, QpType::RC).valid);  // absent from the kernel table
}

TEST(QpStateTable, RequiredAttributesPerType) {
  EXPECT_EQ(transition_rule(RESET, INIT, QpType::RC).required,
            QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS);
  EXPECT_EQ(transition_rule(RESET, INIT, QpType::UD).required, QP_PKEY_INDEX | QP_PORT | QP_QKEY);
  EXPECT_EQ(transition_rule(RESET, INIT, QpType::XRC_RECV).required,
            QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS);
  const uint32_t rtr_rc =
      QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN | QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER;
  EXPECT_EQ(transition_rule(INIT, RTR, QpType::RC).required, rtr_rc);
  EXPECT_EQ(transition_rule(INIT, RTR, QpType::XRC_RECV).required, rtr_rc);
  EXPECT_EQ(transition_rule(INIT, RTR, QpType::XRC_SEND).required,
            QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN);
  EXPECT_EQ(transition_rule(INIT, RTR, QpType::UD).required, 0u);
  const uint32_t rts_rc =
      QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN | QP_MAX_QP_RD_ATOMIC;
  EXPECT_EQ(transition_rule(RTR, RTS, QpType::RC).required, rts_rc);
  EXPECT_EQ(transition_rule(RTR, RTS, QpType::XRC_SEND).required, rts_rc);
  EXPECT_EQ(transition_rule(RTR, RTS, QpType::XRC_RECV).required, QP_TIMEOUT | QP_SQ_PSN);
  EXPECT_EQ(transition_rule(RTR, RTS, QpType::UD).required, QP_SQ_PSN);
  EXPECT_EQ(transition_rule(RTS, SQD, QpType::RC).optional, QP_EN_SQD_ASYNC_NOTIFY);
}

TEST(QpStateTable, CheckModifyNamesTheProblem) {
  EXPECT_EQ(check_modify(RESET, INIT, QpType::RC,
                         QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS, false),
            "");
  EXPECT_EQ(check_modify(RESET, INIT, QpType::RC, QP_STATE | QP_PKEY_INDEX | QP_PORT, false),
            "RESET->INIT for RC requires QP_ACCESS_FLAGS");
  EXPECT_EQ(check_modify(RESET, RTS, QpType::RC, QP_STATE, false), "invalid transition RESET->RTS");
  EXPECT_NE(
      check_modify(RTS, SQD, QpType::RC, QP_STATE | QP_AV, false).find("does not accept QP_AV"),
      std::string::npos);
  EXPECT_NE(
      check_modify(INIT, INIT, QpType::RC, QP_STATE | QP_CUR_STATE, false).find("QP_CUR_STATE"),
      std::string::npos);
  // iWARP: only the state is needed (iw_cm_init_qp_attr), the table still applies.
  EXPECT_EQ(check_modify(RESET, INIT, QpType::RC, QP_STATE, true), "");
  EXPECT_EQ(check_modify(RESET, RTS, QpType::RC, QP_STATE, true), "invalid transition RESET->RTS");
}

// Drives a real QP along a path and checks every transition out of the reached state.
class QpModify : public ::testing::Test {
 protected:
  void SetUp() override {
    lab = lab_of({{"a", "ib"}, {"b", "ib"}});
    na = Node::on(*lab, "a");
    nb = Node::on(*lab, "b");
  }
  // A fresh RC QP brought to state s through valid steps.
  std::shared_ptr<Qp> qp_in(QpState s) {
    auto qp = na.qp();
    auto peer = nb.qp();
    if (s == RESET) return qp;
    to_init(*qp, ACCESS_LOCAL_WRITE);
    if (s == INIT) return qp;
    if (s == ERR) {
      modify_state(*qp, ERR);
      return qp;
    }
    to_rtr(*qp, nb.ctx->query_gid(1, 0), peer->qp_num(), RcParams{});
    if (s == RTR) return qp;
    to_rts(*qp, RcParams{});
    if (s == RTS) return qp;
    modify_state(*qp, SQD);
    return qp;
  }
  // The minimal mask that a valid transition needs, with attribute values that pass.
  static uint32_t mask_for(QpState from, QpState to) {
    return QP_STATE | transition_rule(from, to, QpType::RC).required;
  }

  std::shared_ptr<ModelLab> lab;
  Node na, nb;
};

TEST_F(QpModify, EveryTransitionFromEveryReachableState) {
  for (QpState from : {RESET, INIT, RTR, RTS, SQD, ERR}) {
    for (QpState to : kAll) {
      auto qp = qp_in(from);
      ASSERT_EQ(qp->state(), from);
      QpAttr a;
      a.qp_state = to;
      a.port_num = 1;
      a.ah_attr.dgid = nb.ctx->query_gid(1, 0);
      const int err = err_of([&] { qp->modify(a, mask_for(from, to)); });
      if (transition_rule(from, to, QpType::RC).valid) {
        EXPECT_EQ(err, 0) << to_string(from) << "->" << to_string(to);
        EXPECT_EQ(qp->state(), to);
      } else {
        EXPECT_EQ(err, EINVAL) << to_string(from) << "->" << to_string(to);
        EXPECT_EQ(qp->state(), from);
      }
    }
  }
}

TEST_F(QpModify, MissingAttributeIsEinvalNamingIt) {
  auto qp = na.qp();
  QpAttr a;
  a.qp_state = INIT;
  try {
    qp->modify(a, QP_STATE | QP_PKEY_INDEX | QP_ACCESS_FLAGS);
    FAIL() << "modify without QP_PORT succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EINVAL);
    EXPECT_EQ(e.verb(), "ibv_modify_qp");
    EXPECT_NE(e.detail().find("QP_PORT"), std::string::npos) << e.detail();
  }
  EXPECT_EQ(qp->state(), RESET);
  to_init(*qp, 0);
  a.qp_state = RTR;
  try {
    qp->modify(a, QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN | QP_MAX_DEST_RD_ATOMIC);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.detail().find("QP_MIN_RNR_TIMER"), std::string::npos) << e.detail();
  }
}

TEST_F(QpModify, UdAndXrcRequirements) {
  auto ud = na.qp(QpType::UD);
  QpAttr a;
  a.qp_state = INIT;
  a.port_num = 1;
  EXPECT_EQ(err_of([&] { ud->modify(a, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS); }),
            EINVAL);
  a.qkey = 0x11111111;
  ud->modify(a, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_QKEY);
  modify_state(*ud, RTR);                                      // UD INIT->RTR needs nothing
  EXPECT_EQ(err_of([&] { modify_state(*ud, RTS); }), EINVAL);  // needs QP_SQ_PSN
  modify_state(*ud, RTS, QP_SQ_PSN);
  EXPECT_EQ(ud->state(), RTS);
}

TEST_F(QpModify, CurStateMustMatchAndAttributeRangesAreChecked) {
  auto qp = qp_in(RTS);
  QpAttr a;
  a.qp_state = RTS;
  a.cur_qp_state = RTR;
  EXPECT_EQ(err_of([&] { qp->modify(a, QP_STATE | QP_CUR_STATE); }), EINVAL);
  a.cur_qp_state = RTS;
  EXPECT_EQ(err_of([&] { qp->modify(a, QP_STATE | QP_CUR_STATE); }), 0);
  auto q2 = qp_in(INIT);
  QpAttr r;
  r.qp_state = RTR;
  r.min_rnr_timer = 40;
  EXPECT_EQ(err_of([&] { q2->modify(r, mask_for(INIT, RTR)); }), EINVAL);
  EXPECT_EQ(q2->state(), INIT);
}

TEST_F(QpModify, IwarpNeedsOnlyTheState) {
  auto lab2 = lab_of({{"a", "iwarp-cxgb4"}});
  Node n = Node::on(*lab2, "a");
  auto qp = n.qp();
  modify_state(*qp, INIT);
  modify_state(*qp, RTR, QP_ACCESS_FLAGS);
  modify_state(*qp, RTS);
  EXPECT_EQ(qp->state(), RTS);
  EXPECT_EQ(err_of([&] { modify_state(*qp, INIT); }), EINVAL);
}

TEST_F(QpModify, StateChangesAreRecorded) {
  auto qp = qp_in(RTS);
  std::vector<std::string> seen;
  for (const auto& r : lab->history().snapshot()) {
    if (r.kind == "qp_state" && r.object == qp->label()) {
      seen.push_back(r.data["from"].get<std::string>() + ">" + r.data["to"].get<std::string>());
      EXPECT_EQ(r.data["qp_num"], qp->qp_num());
    }
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"RESET>INIT", "INIT>RTR", "RTR>RTS"}));
}

}  // namespace
}  // namespace qp_state_table_test
}  // namespace rdmalab::model
