#include "verbs/convert.h"

#include <arpa/inet.h>
#include <sys/utsname.h>

#include <cstdio>
#include <cstring>

#include "rdmalab/driver_facts.h"
#include "rdmalab/error.h"

namespace rdmalab::verbs {

// The engine's enums mirror ibv's; these fail the build if either side moves.
constexpr uint32_t u(uint32_t v) {
  return v;
}
static_assert(u(QP_DEST_QPN) == u(IBV_QP_DEST_QPN) && u(QP_CAP) == u(IBV_QP_CAP) &&
              u(QP_STATE) == u(IBV_QP_STATE) && u(QP_ALT_PATH) == u(IBV_QP_ALT_PATH));
static_assert(u(ACCESS_REMOTE_ATOMIC) == u(IBV_ACCESS_REMOTE_ATOMIC) &&
              u(ACCESS_LOCAL_WRITE) == u(IBV_ACCESS_LOCAL_WRITE));
static_assert(static_cast<int>(WcStatus::GENERAL_ERR) == IBV_WC_GENERAL_ERR &&
              static_cast<int>(WcStatus::WR_FLUSH_ERR) == IBV_WC_WR_FLUSH_ERR);

ibv_qp_state to_ibv(QpState s) {
  switch (s) {
    case QpState::RESET:
      return IBV_QPS_RESET;
    case QpState::INIT:
      return IBV_QPS_INIT;
    case QpState::RTR:
      return IBV_QPS_RTR;
    case QpState::RTS:
      return IBV_QPS_RTS;
    case QpState::SQD:
      return IBV_QPS_SQD;
    case QpState::SQE:
      return IBV_QPS_SQE;
    case QpState::ERR:
      return IBV_QPS_ERR;
  }
  throw Error("to_ibv", EINVAL, "QpState");
}

QpState from_ibv(ibv_qp_state s) {
  switch (s) {
    case IBV_QPS_RESET:
      return QpState::RESET;
    case IBV_QPS_INIT:
      return QpState::INIT;
    case IBV_QPS_RTR:
      return QpState::RTR;
    case IBV_QPS_RTS:
      return QpState::RTS;
    case IBV_QPS_SQD:
      return QpState::SQD;
    case IBV_QPS_SQE:
      return QpState::SQE;
    case IBV_QPS_ERR:
      return QpState::ERR;
    default:
      break;  // IBV_QPS_UNKNOWN
  }
  throw Error("ibv_query_qp", EINVAL, "unknown qp_state " + std::to_string(s));
}

ibv_qp_type to_ibv(QpType t) {
  switch (t) {
    case QpType::RC:
      return IBV_QPT_RC;
    case QpType::UD:
      return IBV_QPT_UD;
    case QpType::XRC_SEND:
      return IBV_QPT_XRC_SEND;
    case QpType::XRC_RECV:
      return IBV_QPT_XRC_RECV;
  }
  throw Error("to_ibv", EINVAL, "QpType");
}

ibv_mtu mtu_to_ibv(uint32_t bytes) {
  switch (bytes) {
    case 256:
      return IBV_MTU_256;
    case 512:
      return IBV_MTU_512;
    case 1024:
      return IBV_MTU_1024;
    case 2048:
      return IBV_MTU_2048;
    case 4096:
      return IBV_MTU_4096;
    default:
      break;
  }
  throw Error("ibv_modify_qp", EINVAL, "path_mtu " + std::to_string(bytes) + " bytes");
}

uint32_t mtu_from_ibv(ibv_mtu m) {
  const int v = static_cast<int>(m);
  return v >= IBV_MTU_256 && v <= IBV_MTU_4096 ? 128u << v : 0;
}

PortState from_ibv(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_INIT:
      return PortState::INIT;
    case IBV_PORT_ARMED:
      return PortState::ARMED;
    case IBV_PORT_ACTIVE:
    case IBV_PORT_ACTIVE_DEFER:
      return PortState::ACTIVE;
    default:
      return PortState::DOWN;  // NOP, DOWN
  }
}

Gid from_ibv(const ibv_gid& g) {
  Gid out;
  std::memcpy(out.raw.data(), g.raw, out.raw.size());
  return out;
}

ibv_ah_attr to_ibv(const AhAttr& a) {
  ibv_ah_attr out{};
  out.dlid = a.dlid;
  out.sl = a.sl;
  out.port_num = a.port_num;
  // A GID names the destination: RoCE and iWARP always, IB across subnets.
  if (a.dgid != Gid{}) {
    out.is_global = 1;
    std::memcpy(out.grh.dgid.raw, a.dgid.raw.data(), a.dgid.raw.size());
    out.grh.sgid_index = a.sgid_index;
    out.grh.hop_limit = 64;
  }
  return out;
}

AhAttr from_ibv(const ibv_ah_attr& a) {
  AhAttr out;
  out.dlid = a.dlid;
  out.sl = a.sl;
  out.port_num = a.port_num;
  if (a.is_global != 0) {
    out.dgid = from_ibv(a.grh.dgid);
    out.sgid_index = a.grh.sgid_index;
  }
  return out;
}

ibv_qp_cap to_ibv(const QpCap& cap) {
  ibv_qp_cap out{};
  out.max_send_wr = cap.max_send_wr;
  out.max_recv_wr = cap.max_recv_wr;
  out.max_send_sge = cap.max_send_sge;
  out.max_recv_sge = cap.max_recv_sge;
  out.max_inline_data = cap.max_inline_data;
  return out;
}

ibv_qp_attr to_ibv(const QpAttr& a, uint32_t mask) {
  ibv_qp_attr out{};
  if (mask & QP_STATE) out.qp_state = to_ibv(a.qp_state);
  if (mask & QP_CUR_STATE) out.cur_qp_state = to_ibv(a.cur_qp_state);
  if (mask & QP_EN_SQD_ASYNC_NOTIFY) out.en_sqd_async_notify = a.en_sqd_async_notify ? 1 : 0;
  if (mask & QP_ACCESS_FLAGS) out.qp_access_flags = a.qp_access_flags;
  if (mask & QP_PKEY_INDEX) out.pkey_index = a.pkey_index;
  if (mask & QP_PORT) out.port_num = a.port_num;
  if (mask & QP_QKEY) out.qkey = a.qkey;
  if (mask & QP_AV) out.ah_attr = to_ibv(a.ah_attr);
  if (mask & QP_PATH_MTU) out.path_mtu = mtu_to_ibv(a.path_mtu);
  if (mask & QP_TIMEOUT) out.timeout = a.timeout;
  if (mask & QP_RETRY_CNT) out.retry_cnt = a.retry_cnt;
  if (mask & QP_RNR_RETRY) out.rnr_retry = a.rnr_retry;
  if (mask & QP_RQ_PSN) out.rq_psn = a.rq_psn;
  if (mask & QP_MAX_QP_RD_ATOMIC) out.max_rd_atomic = a.max_rd_atomic;
  if (mask & QP_MIN_RNR_TIMER) out.min_rnr_timer = a.min_rnr_timer;
  if (mask & QP_SQ_PSN) out.sq_psn = a.sq_psn;
  if (mask & QP_MAX_DEST_RD_ATOMIC) out.max_dest_rd_atomic = a.max_dest_rd_atomic;
  if (mask & QP_CAP) out.cap = to_ibv(a.cap);
  if (mask & QP_DEST_QPN) out.dest_qp_num = a.dest_qp_num;
  return out;
}

QpAttr from_ibv(const ibv_qp_attr& a) {
  QpAttr out;
  out.qp_state = from_ibv(a.qp_state);
  out.cur_qp_state = from_ibv(a.cur_qp_state);
  out.qp_access_flags = a.qp_access_flags;
  out.pkey_index = a.pkey_index;
  out.port_num = a.port_num;
  out.qkey = a.qkey;
  out.ah_attr = from_ibv(a.ah_attr);
  out.path_mtu = mtu_from_ibv(a.path_mtu);
  out.dest_qp_num = a.dest_qp_num;
  out.rq_psn = a.rq_psn;
  out.sq_psn = a.sq_psn;
  out.max_rd_atomic = a.max_rd_atomic;
  out.max_dest_rd_atomic = a.max_dest_rd_atomic;
  out.min_rnr_timer = a.min_rnr_timer;
  out.timeout = a.timeout;
  out.retry_cnt = a.retry_cnt;
  out.rnr_retry = a.rnr_retry;
  out.en_sqd_async_notify = a.en_sqd_async_notify != 0;
  out.sq_draining = a.sq_draining != 0;
  out.cap.max_send_wr = a.cap.max_send_wr;
  out.cap.max_recv_wr = a.cap.max_recv_wr;
  out.cap.max_send_sge = a.cap.max_send_sge;
  out.cap.max_recv_sge = a.cap.max_recv_sge;
  out.cap.max_inline_data = a.cap.max_inline_data;
  return out;
}

ibv_wr_opcode to_ibv(WrOpcode o) {
  switch (o) {
    case WrOpcode::SEND:
      return IBV_WR_SEND;
    case WrOpcode::SEND_WITH_IMM:
      return IBV_WR_SEND_WITH_IMM;
    case WrOpcode::RDMA_WRITE:
      return IBV_WR_RDMA_WRITE;
    case WrOpcode::RDMA_WRITE_WITH_IMM:
      return IBV_WR_RDMA_WRITE_WITH_IMM;
    case WrOpcode::RDMA_READ:
      return IBV_WR_RDMA_READ;
  }
  throw Error("ibv_post_send", EINVAL, "opcode");
}

namespace {
void fill_sges(const std::vector<Sge>& in, std::vector<ibv_sge>& out) {
  out.clear();
  for (const Sge& s : in) out.push_back(ibv_sge{s.addr, s.length, s.lkey});
}
}  // namespace

void to_ibv(const SendWr& in, QpType qp_type, ibv_ah* ah, IbvSendWr& out) {
  fill_sges(in.sg_list, out.sge);
  out.wr = ibv_send_wr{};
  out.wr.wr_id = in.wr_id;
  out.wr.sg_list = out.sge.empty() ? nullptr : out.sge.data();
  out.wr.num_sge = static_cast<int>(out.sge.size());
  out.wr.opcode = to_ibv(in.opcode);
  out.wr.send_flags = in.signaled ? IBV_SEND_SIGNALED : 0;
  if (in.opcode == WrOpcode::SEND_WITH_IMM || in.opcode == WrOpcode::RDMA_WRITE_WITH_IMM) {
    out.wr.imm_data = htonl(in.imm_data);
  }
  if (qp_type == QpType::UD) {
    if (ah == nullptr) throw Error("ibv_post_send", EINVAL, "UD send without an address");
    out.wr.wr.ud.ah = ah;
    out.wr.wr.ud.remote_qpn = in.remote_qpn;
    out.wr.wr.ud.remote_qkey = in.remote_qkey;
  } else if (in.opcode != WrOpcode::SEND && in.opcode != WrOpcode::SEND_WITH_IMM) {
    out.wr.wr.rdma.remote_addr = in.remote_addr;
    out.wr.wr.rdma.rkey = in.rkey;
  }
  if (qp_type == QpType::XRC_SEND) out.wr.qp_type.xrc.remote_srqn = in.remote_srqn;
}

void to_ibv(const RecvWr& in, IbvRecvWr& out) {
  fill_sges(in.sg_list, out.sge);
  out.wr = ibv_recv_wr{};
  out.wr.wr_id = in.wr_id;
  out.wr.sg_list = out.sge.empty() ? nullptr : out.sge.data();
  out.wr.num_sge = static_cast<int>(out.sge.size());
}

WorkCompletion from_ibv(const ibv_wc& wc) {
  WorkCompletion out;
  out.wr_id = wc.wr_id;
  out.status = static_cast<WcStatus>(wc.status);
  switch (wc.opcode) {
    case IBV_WC_RDMA_WRITE:
      out.opcode = WcOpcode::RDMA_WRITE;
      break;
    case IBV_WC_RDMA_READ:
      out.opcode = WcOpcode::RDMA_READ;
      break;
    case IBV_WC_RECV:
      out.opcode = WcOpcode::RECV;
      break;
    case IBV_WC_RECV_RDMA_WITH_IMM:
      out.opcode = WcOpcode::RECV_RDMA_WITH_IMM;
      break;
    default:
      out.opcode = WcOpcode::SEND;
      break;  // SEND, and opcodes the engine never posts
  }
  out.vendor_err = wc.vendor_err;
  out.byte_len = wc.byte_len;
  out.with_imm = (wc.wc_flags & IBV_WC_WITH_IMM) != 0;
  out.imm_data = out.with_imm ? ntohl(wc.imm_data) : 0;
  out.qp_num = wc.qp_num;
  out.src_qp = wc.src_qp;
  return out;
}

std::optional<AsyncEventType> from_ibv(ibv_event_type t) {
  switch (t) {
    case IBV_EVENT_CQ_ERR:
      return AsyncEventType::CQ_ERR;
    case IBV_EVENT_QP_FATAL:
      return AsyncEventType::QP_FATAL;
    case IBV_EVENT_QP_REQ_ERR:
      return AsyncEventType::QP_REQ_ERR;
    case IBV_EVENT_QP_ACCESS_ERR:
      return AsyncEventType::QP_ACCESS_ERR;
    case IBV_EVENT_COMM_EST:
      return AsyncEventType::COMM_EST;
    case IBV_EVENT_SQ_DRAINED:
      return AsyncEventType::SQ_DRAINED;
    case IBV_EVENT_PATH_MIG:
      return AsyncEventType::PATH_MIG;
    case IBV_EVENT_PATH_MIG_ERR:
      return AsyncEventType::PATH_MIG_ERR;
    case IBV_EVENT_DEVICE_FATAL:
      return AsyncEventType::DEVICE_FATAL;
    case IBV_EVENT_PORT_ACTIVE:
      return AsyncEventType::PORT_ACTIVE;
    case IBV_EVENT_PORT_ERR:
      return AsyncEventType::PORT_ERR;
    case IBV_EVENT_LID_CHANGE:
      return AsyncEventType::LID_CHANGE;
    case IBV_EVENT_PKEY_CHANGE:
      return AsyncEventType::PKEY_CHANGE;
    case IBV_EVENT_SM_CHANGE:
      return AsyncEventType::SM_CHANGE;
    case IBV_EVENT_SRQ_ERR:
      return AsyncEventType::SRQ_ERR;
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      return AsyncEventType::SRQ_LIMIT_REACHED;
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return AsyncEventType::QP_LAST_WQE_REACHED;
    case IBV_EVENT_CLIENT_REREGISTER:
      return AsyncEventType::CLIENT_REREGISTER;
    case IBV_EVENT_GID_CHANGE:
      return AsyncEventType::GID_CHANGE;
    default:
      return std::nullopt;  // IBV_EVENT_WQ_FATAL and later additions
  }
}

Transport transport_of(ibv_node_type node_type, uint8_t link_layer) {
  if (node_type == IBV_NODE_RNIC) return Transport::iWARP;
  if (link_layer == IBV_LINK_LAYER_ETHERNET) return Transport::RoCE;
  return Transport::IB;
}

KernelRelease kernel_release_of(const char* release) {
  int ma = 0, mi = 0;
  if (std::sscanf(release, "%d.%d", &ma, &mi) != 2 || ma <= 0) return {};
  return {ma, mi};
}

KernelRelease running_kernel() {
  utsname u{};
  if (uname(&u) != 0) return {};
  return kernel_release_of(u.release);
}

DeviceCaps caps_from(const DeviceFacts& f) {
  const ibv_device_attr& a = f.attr.orig_attr;
  DeviceCaps c;
  c.name = f.name;
  c.personality = f.driver;
  c.transport = transport_of(f.node_type, f.port1_link_layer);
  c.xrc = (a.device_cap_flags & IBV_DEVICE_XRC) != 0;
  c.srq = a.max_srq > 0;
  c.ud = c.transport != Transport::iWARP;  // iWARP has no datagram service
  c.node_guid = a.node_guid;
  c.max_qp = static_cast<uint32_t>(a.max_qp);
  c.max_qp_wr = static_cast<uint32_t>(a.max_qp_wr);
  c.max_sge = static_cast<uint32_t>(a.max_sge);
  c.max_cq = static_cast<uint32_t>(a.max_cq);
  c.max_cqe = static_cast<uint32_t>(a.max_cqe);
  c.max_srq = static_cast<uint32_t>(a.max_srq);
  c.max_srq_wr = static_cast<uint32_t>(a.max_srq_wr);
  c.max_mr = static_cast<uint32_t>(a.max_mr);
  c.phys_port_cnt = a.phys_port_cnt;
  c.local_ca_ack_delay = a.local_ca_ack_delay;
  c.xrc_tgt_lifetime = XrcTgtLifetime::kUnknown;
  // Not discoverable from the device: the driver's row (rdmalab/driver_facts.h). Scenarios
  // that depend on a guess (a row without err_post) must probe, not trust it.
  const DriverFacts d = driver_facts(f.driver);
  apply_driver_facts(d, c);
  apply_device_facts(d, f.kernel, c);
  return c;
}

}  // namespace rdmalab::verbs
