#include "verbs/convert.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

#include "rdmalab/error.h"

namespace rdmalab::verbs {
namespace {

TEST(Convert, QpStatesRoundTrip) {
  for (QpState s : {QpState::RESET, QpState::INIT, QpState::RTR, QpState::RTS, QpState::SQD,
                    QpState::SQE, QpState::ERR}) {
    EXPECT_EQ(from_ibv(to_ibv(s)), s) << to_string(s);
  }
  EXPECT_EQ(to_ibv(QpState::SQD), IBV_QPS_SQD);
  EXPECT_THROW(from_ibv(IBV_QPS_UNKNOWN), Error);
}

TEST(Convert, QpTypes) {
  EXPECT_EQ(to_ibv(QpType::RC), IBV_QPT_RC);
  EXPECT_EQ(to_ibv(QpType::UD), IBV_QPT_UD);
  EXPECT_EQ(to_ibv(QpType::XRC_SEND), IBV_QPT_XRC_SEND);
  EXPECT_EQ(to_ibv(QpType::XRC_RECV), IBV_QPT_XRC_RECV);
}

TEST(Convert, MtuBytesAndEnum) {
  EXPECT_EQ(mtu_to_ibv(256), IBV_MTU_256);
  EXPECT_EQ(mtu_to_ibv(4096), IBV_MTU_4096);
  EXPECT_EQ(mtu_from_ibv(IBV_MTU_1024), 1024u);
  try {
    mtu_to_ibv(1500);
    FAIL() << "1500 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EINVAL);
    EXPECT_EQ(e.verb(), "ibv_modify_qp");
  }
}

TEST(Convert, QpAttrCopiesOnlyMaskedFields) {
  QpAttr a;
  a.qp_state = QpState::RTR;
  a.dest_qp_num = 0x1234;
  a.rq_psn = 77;
  a.path_mtu = 2048;
  a.timeout = 19;
  const ibv_qp_attr x = to_ibv(a, QP_STATE | QP_DEST_QPN | QP_PATH_MTU);
  EXPECT_EQ(x.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(x.dest_qp_num, 0x1234u);
  EXPECT_EQ(x.path_mtu, IBV_MTU_2048);
  EXPECT_EQ(x.rq_psn, 0u);   // not in the mask
  EXPECT_EQ(x.timeout, 0u);  // not in the mask
}

TEST(Convert, QpAttrRoundTripsThroughIbv) {
  QpAttr a;
  a.qp_state = QpState::RTS;
  a.cur_qp_state = QpState::RTR;
  a.qp_access_flags = ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
  a.qkey = 0x11111111;
  a.ah_attr.dlid = 5;
  a.ah_attr.dgid.raw[15] = 1;
  a.ah_attr.sgid_index = 3;
  a.path_mtu = 4096;
  a.dest_qp_num = 9;
  a.rq_psn = 10;
  a.sq_psn = 11;
  a.max_rd_atomic = 4;
  a.max_dest_rd_atomic = 2;
  a.min_rnr_timer = 5;
  a.timeout = 18;
  a.retry_cnt = 6;
  a.rnr_retry = 3;
  a.cap.max_send_wr = 33;
  const uint32_t all = ((1u << 21) - 1) & ~static_cast<uint32_t>(QP_ALT_PATH | QP_PATH_MIG_STATE);
  const QpAttr b = from_ibv(to_ibv(a, all));
  EXPECT_EQ(b.qp_state, a.qp_state);
  EXPECT_EQ(b.cur_qp_state, a.cur_qp_state);
  EXPECT_EQ(b.qp_access_flags, a.qp_access_flags);
  EXPECT_EQ(b.qkey, a.qkey);
  EXPECT_EQ(b.ah_attr.dlid, 5);
  EXPECT_EQ(b.ah_attr.dgid, a.ah_attr.dgid);
  EXPECT_EQ(b.ah_attr.sgid_index, 3);
  EXPECT_EQ(b.path_mtu, 4096u);
  EXPECT_EQ(b.dest_qp_num, 9u);
  EXPECT_EQ(b.rq_psn, 10u);
  EXPECT_EQ(b.sq_psn, 11u);
  EXPECT_EQ(b.max_rd_atomic, 4);
  EXPECT_EQ(b.max_dest_rd_atomic, 2);
  EXPECT_EQ(b.min_rnr_timer, 5);
  EXPECT_EQ(b.timeout, 18);
  EXPECT_EQ(b.retry_cnt, 6);
  EXPECT_EQ(b.rnr_retry, 3);
  EXPECT_EQ(b.cap.max_send_wr, 33u);
}

TEST(Convert, AhWithoutGidIsNotGlobal) {
  AhAttr a;
  a.dlid = 7;
  EXPECT_EQ(to_ibv(a).is_global, 0);
  a.dgid.raw[0] = 0xfe;
  const ibv_ah_attr x = to_ibv(a);
  EXPECT_EQ(x.is_global, 1);
  EXPECT_EQ(x.grh.dgid.raw[0], 0xfe);
  EXPECT_GT(x.grh.hop_limit, 0);
}

TEST(Convert, RdmaWriteWithImmSetsRemoteAndNetworkOrderImm) {
  SendWr w;
  w.wr_id = 42;
  w.opcode = WrOpcode::RDMA_WRITE_WITH_IMM;
  w.sg_list = {{0x1000, 64, 0xaa}, {0x2000, 32, 0xbb}};
  w.imm_data = 0x01020304;
  w.remote_addr = 0xdead0000;
  w.rkey = 0x77;
  w.signaled = false;
  IbvSendWr out;
  to_ibv(w, QpType::RC, nullptr, out);
  EXPECT_EQ(out.wr.wr_id, 42u);
  EXPECT_EQ(out.wr.opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
  ASSERT_EQ(out.wr.num_sge, 2);
  EXPECT_EQ(out.wr.sg_list, out.sge.data());
  EXPECT_EQ(out.wr.sg_list[1].lkey, 0xbbu);
  EXPECT_EQ(out.wr.imm_data, htonl(0x01020304));
  EXPECT_EQ(out.wr.wr.rdma.remote_addr, 0xdead0000u);
  EXPECT_EQ(out.wr.wr.rdma.rkey, 0x77u);
  EXPECT_EQ(out.wr.send_flags & IBV_SEND_SIGNALED, 0u);
  EXPECT_EQ(out.wr.next, nullptr);
}

TEST(Convert, XrcSendCarriesRemoteSrqn) {
  SendWr w;
  w.remote_srqn = 0x55;
  IbvSendWr out;
  to_ibv(w, QpType::XRC_SEND, nullptr, out);
  EXPECT_EQ(out.wr.qp_type.xrc.remote_srqn, 0x55u);
  EXPECT_EQ(out.wr.send_flags & IBV_SEND_SIGNALED, static_cast<unsigned>(IBV_SEND_SIGNALED));
}

TEST(Convert, UdSendNeedsAnAddressHandle) {
  SendWr w;
  w.remote_qpn = 3;
  w.remote_qkey = 0x1111;
  IbvSendWr out;
  EXPECT_THROW(to_ibv(w, QpType::UD, nullptr, out), Error);
  ibv_ah fake{};
  to_ibv(w, QpType::UD, &fake, out);
  EXPECT_EQ(out.wr.wr.ud.ah, &fake);
  EXPECT_EQ(out.wr.wr.ud.remote_qpn, 3u);
  EXPECT_EQ(out.wr.wr.ud.remote_qkey, 0x1111u);
}

TEST(Convert, RecvWr) {
  RecvWr r;
  r.wr_id = 9;
  r.sg_list = {{0x10, 8, 1}};
  IbvRecvWr out;
  to_ibv(r, out);
  EXPECT_EQ(out.wr.wr_id, 9u);
  ASSERT_EQ(out.wr.num_sge, 1);
  EXPECT_EQ(out.wr.sg_list[0].addr, 0x10u);
}

TEST(Convert, WorkCompletionFromIbv) {
  ibv_wc wc{};
  wc.wr_id = 5;
  wc.status = IBV_WC_RETRY_EXC_ERR;
  wc.vendor_err = 0x81;
  wc.qp_num = 12;
  EXPECT_EQ(from_ibv(wc).status, WcStatus::RETRY_EXC_ERR);
  EXPECT_EQ(from_ibv(wc).vendor_err, 0x81u);
  wc.status = IBV_WC_SUCCESS;
  wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
  wc.wc_flags = IBV_WC_WITH_IMM;
  wc.imm_data = htonl(0xabcd);
  wc.byte_len = 100;
  const WorkCompletion c = from_ibv(wc);
  EXPECT_EQ(c.opcode, WcOpcode::RECV_RDMA_WITH_IMM);
  EXPECT_TRUE(c.with_imm);
  EXPECT_EQ(c.imm_data, 0xabcdu);
  EXPECT_EQ(c.byte_len, 100u);
  EXPECT_EQ(c.qp_num, 12u);
  wc.opcode = IBV_WC_RDMA_READ;
  EXPECT_EQ(from_ibv(wc).opcode, WcOpcode::RDMA_READ);
}

TEST(Convert, AsyncEventTypes) {
  EXPECT_EQ(from_ibv(IBV_EVENT_QP_LAST_WQE_REACHED), AsyncEventType::QP_LAST_WQE_REACHED);
  EXPECT_EQ(from_ibv(IBV_EVENT_SRQ_LIMIT_REACHED), AsyncEventType::SRQ_LIMIT_REACHED);
  EXPECT_EQ(from_ibv(IBV_EVENT_PORT_ERR), AsyncEventType::PORT_ERR);
  EXPECT_EQ(from_ibv(IBV_EVENT_GID_CHANGE), AsyncEventType::GID_CHANGE);
  EXPECT_FALSE(from_ibv(IBV_EVENT_WQ_FATAL).has_value());
}

TEST(Convert, PortStates) {
  EXPECT_EQ(from_ibv(IBV_PORT_ACTIVE), PortState::ACTIVE);
  EXPECT_EQ(from_ibv(IBV_PORT_ACTIVE_DEFER), PortState::ACTIVE);
  EXPECT_EQ(from_ibv(IBV_PORT_DOWN), PortState::DOWN);
  EXPECT_EQ(from_ibv(IBV_PORT_ARMED), PortState::ARMED);
}

TEST(Convert, TransportFromNodeTypeAndLinkLayer) {
  EXPECT_EQ(transport_of(IBV_NODE_CA, IBV_LINK_LAYER_INFINIBAND), Transport::IB);
  EXPECT_EQ(transport_of(IBV_NODE_CA, IBV_LINK_LAYER_ETHERNET), Transport::RoCE);
  EXPECT_EQ(transport_of(IBV_NODE_RNIC, IBV_LINK_LAYER_ETHERNET), Transport::iWARP);
}

TEST(Convert, KernelRelease) {
  EXPECT_EQ(kernel_release_of("6.1.0-56-amd64"), (KernelRelease{6, 1}));
  EXPECT_EQ(kernel_release_of("7.2.13+deb14-amd64"), (KernelRelease{7, 2}));
  EXPECT_EQ(kernel_release_of("6.12"), (KernelRelease{6, 12}));
  EXPECT_FALSE(kernel_release_of("").known());
  EXPECT_FALSE(kernel_release_of("6").known());
  EXPECT_FALSE(kernel_release_of("linux").known());
  EXPECT_TRUE(running_kernel().known());  // uname(2) on Linux
}

// What caps_from said per driver before the driver facts table (its if-lines), one row each:
// the table must keep every answer.
struct OldFacts {
  const char* driver;
  ibv_node_type node_type;
  uint8_t link_layer;
  ErrPostPolicy err_post;
  bool retry_cnt_7_infinite;
  bool siw_query;  // reports_qp_state only from 6.8
  bool disassociates;
  bool siw_like;  // send_completes_on_handoff and connect_is_synchronous
  uint16_t iw_close_timeout_s;
  std::vector<AsyncEventType> raises;
};

using Ev = AsyncEventType;
constexpr auto kCa = IBV_NODE_CA;
constexpr auto kRnic = IBV_NODE_RNIC;
constexpr uint8_t kEth = IBV_LINK_LAYER_ETHERNET;
constexpr uint8_t kIb = IBV_LINK_LAYER_INFINIBAND;
constexpr auto kFlush = ErrPostPolicy::kFlush;
constexpr auto kRefuse = ErrPostPolicy::kRefuse;

const OldFacts kOldFacts[] = {
    {"rxe",
     kCa,
     kEth,
     kFlush,
     true,
     false,
     false,
     false,
     0,
     {Ev::CQ_ERR, Ev::PORT_ERR, Ev::PORT_ACTIVE, Ev::SRQ_LIMIT_REACHED, Ev::SQ_DRAINED}},
    {"siw",
     kRnic,
     kEth,
     ErrPostPolicy::kStrand,
     false,
     true,
     false,
     true,
     0,
     {Ev::QP_FATAL, Ev::QP_REQ_ERR, Ev::SQ_DRAINED, Ev::CQ_ERR, Ev::PORT_ACTIVE, Ev::PORT_ERR,
      Ev::LID_CHANGE, Ev::DEVICE_FATAL, Ev::SRQ_LIMIT_REACHED}},
    {"cxgb4", kRnic, kEth, kRefuse, false, false, false, false, 60, {}},
    {"mlx5", kCa, kIb, kFlush, false, false, true, false, 0, {}},
    {"mlx5", kCa, kEth, kFlush, false, false, true, false, 0, {}},
    {"mlx4", kCa, kIb, kFlush, false, false, true, false, 0, {}},
    {"mana", kCa, kEth, kFlush, false, false, true, false, 0, {}},
    {"irdma", kRnic, kEth, kRefuse, false, false, true, false, 0, {}},
    {"irdma", kCa, kEth, kFlush, false, false, true, false, 0, {}},
    {"bnxt_re", kCa, kEth, kFlush, false, false, true, false, 0, {}},
    {"hns", kCa, kEth, kFlush, false, false, true, false, 0, {}},
    {"erdma", kRnic, kEth, kRefuse, false, false, true, false, 0, {}},
    {"ionic", kCa, kEth, kFlush, false, false, true, false, 0, {}},
    {"efa", kCa, kIb, kFlush, false, false, false, false, 0, {}},  // no row: the defaults
    {"qedr", kRnic, kEth, kRefuse, false, false, false, false, 0, {}},
};

std::multiset<Ev> as_set(const std::vector<Ev>& v) {
  return {v.begin(), v.end()};
}

void expect_old_facts(const OldFacts& o, const DeviceCaps& c) {
  EXPECT_EQ(c.personality, o.driver);
  EXPECT_EQ(c.err_post, o.err_post);
  EXPECT_EQ(c.retry_cnt_7_infinite, o.retry_cnt_7_infinite);
  EXPECT_EQ(c.disassociates, o.disassociates);
  EXPECT_EQ(c.send_completes_on_handoff, o.siw_like);
  EXPECT_EQ(c.connect_is_synchronous, o.siw_like);
  EXPECT_EQ(c.iw_close_timeout_s, o.iw_close_timeout_s);
  EXPECT_EQ(as_set(c.raises), as_set(o.raises));  // an event list's order is no fact
  EXPECT_EQ(c.xrc_tgt_lifetime, XrcTgtLifetime::kUnknown);
}

TEST(Convert, ProviderFactsAsTheOldIfLines) {
  for (const OldFacts& o : kOldFacts) {
    for (const KernelRelease kernel : {KernelRelease{6, 1}, KernelRelease{6, 12}}) {
      DeviceFacts f;
      f.driver = o.driver;
      f.node_type = o.node_type;
      f.port1_link_layer = o.link_layer;
      f.kernel = kernel;
      const DeviceCaps c = caps_from(f);
      SCOPED_TRACE(std::string(o.driver) + (o.node_type == kRnic ? " (iWARP)" : "") + " on " +
                   std::to_string(kernel.major) + "." + std::to_string(kernel.minor));
      EXPECT_EQ(c.reports_qp_state, !o.siw_query || kernel >= KernelRelease({6, 8}));
      expect_old_facts(o, c);
      // The facts added since the old if-lines: by transport and by the kernel.
      EXPECT_EQ(c.rts_needs_cm, o.node_type == kRnic);
      EXPECT_EQ(c.refused_send_resend_races,
                std::string(o.driver) == "rxe" && kernel < KernelRelease({6, 12}));
    }
  }
}

// What a device says of its QPNs is its row's; a driver no source settles claims nothing.
TEST(Convert, QpnPolicyFromTheRow) {
  DeviceFacts f;
  f.port1_link_layer = kEth;
  const std::pair<const char*, QpnPolicy> rows[] = {{"mana", QpnPolicy::kLifo},
                                                    {"rxe", QpnPolicy::kIncrement},
                                                    {"mlx5", QpnPolicy::kIncrement},
                                                    {"bnxt_re", QpnPolicy::kUnknown},
                                                    {"efa", QpnPolicy::kUnknown}};
  for (const auto& [driver, policy] : rows) {
    f.driver = driver;
    EXPECT_EQ(caps_from(f).qpn_policy, policy) << driver;
  }
}

// A device whose kernel is not known answers as the older kernels do.
TEST(Convert, UnknownKernelIsTheOlder) {
  DeviceFacts f;
  f.driver = "rxe";
  f.port1_link_layer = kEth;
  EXPECT_TRUE(caps_from(f).refused_send_resend_races);
  f.driver = "siw";
  f.node_type = kRnic;
  EXPECT_FALSE(caps_from(f).reports_qp_state);
}

TEST(Convert, CapsFromDeviceAttr) {
  DeviceFacts f;
  f.name = "rxe0";
  f.driver = "rxe";
  f.node_type = IBV_NODE_CA;
  f.port1_link_layer = IBV_LINK_LAYER_ETHERNET;
  f.attr.orig_attr.device_cap_flags = IBV_DEVICE_XRC;
  f.attr.orig_attr.max_qp = 1000;
  f.attr.orig_attr.max_srq = 10;
  f.attr.orig_attr.local_ca_ack_delay = 15;
  f.attr.orig_attr.phys_port_cnt = 1;
  const DeviceCaps c = caps_from(f);
  EXPECT_EQ(c.name, "rxe0");
  EXPECT_EQ(c.personality, "rxe");
  EXPECT_EQ(c.transport, Transport::RoCE);
  EXPECT_TRUE(c.xrc);
  EXPECT_TRUE(c.srq);
  EXPECT_TRUE(c.ud);
  EXPECT_EQ(c.max_qp, 1000u);
  EXPECT_EQ(c.local_ca_ack_delay, 15);
  EXPECT_EQ(c.err_post, ErrPostPolicy::kFlush);
  EXPECT_EQ(c.xrc_tgt_lifetime, XrcTgtLifetime::kUnknown);
  EXPECT_TRUE(c.retry_cnt_7_infinite);
  EXPECT_TRUE(c.raises_event(AsyncEventType::CQ_ERR));  // vmlab.md: what rxe raised
  EXPECT_FALSE(c.raises_event(AsyncEventType::QP_FATAL));

  f.name = "siw0";
  f.driver = "siw";
  f.node_type = IBV_NODE_RNIC;
  f.attr.orig_attr.device_cap_flags = 0;
  const DeviceCaps s = caps_from(f);
  EXPECT_EQ(s.transport, Transport::iWARP);
  EXPECT_FALSE(s.xrc);
  EXPECT_FALSE(s.ud);
  EXPECT_EQ(s.err_post, ErrPostPolicy::kStrand);  // user-mapped SQ: nothing flushes a late WR
  EXPECT_FALSE(s.retry_cnt_7_infinite);
  EXPECT_TRUE(s.raises_event(AsyncEventType::QP_FATAL));

  f.name = "cxgb4_0";
  f.driver = "cxgb4";
  const DeviceCaps x = caps_from(f);
  EXPECT_EQ(x.err_post, ErrPostPolicy::kRefuse);  // libcxgb4 refuses posts in ERR
  EXPECT_TRUE(x.raises.empty());                  // not documented: unknown
}

}  // namespace
}  // namespace rdmalab::verbs
