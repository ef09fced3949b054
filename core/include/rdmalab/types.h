// Vocabulary of the engine: the enums and plain structs of the verbs API, named as in
// libibverbs (ibv_*) and the IBTA specification so a reviewer can hold them against both.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rdmalab {

// Virtual time in the model, CLOCK_MONOTONIC in the verbs backend. Units always in the name.
using TimeNs = int64_t;
inline constexpr TimeNs kNsPerUs = 1000;
inline constexpr TimeNs kNsPerMs = TimeNs{1000} * 1000;
inline constexpr TimeNs kNsPerSec = TimeNs{1000} * 1000 * 1000;

enum class Transport { IB, RoCE, iWARP };

enum class QpType { RC, UD, XRC_SEND, XRC_RECV };

// IBV_QPS_*. For iWARP QPs SQD is the RDMAC CLOSING state (seed 000).
enum class QpState { RESET, INIT, RTR, RTS, SQD, SQE, ERR };

// IBV_QP_* attribute mask bits, same values as libibverbs.
enum QpAttrMask : uint32_t {
  QP_STATE = 1u << 0,
  QP_CUR_STATE = 1u << 1,
  QP_EN_SQD_ASYNC_NOTIFY = 1u << 2,
  QP_ACCESS_FLAGS = 1u << 3,
  QP_PKEY_INDEX = 1u << 4,
  QP_PORT = 1u << 5,
  QP_QKEY = 1u << 6,
  QP_AV = 1u << 7,
  QP_PATH_MTU = 1u << 8,
  QP_TIMEOUT = 1u << 9,
  QP_RETRY_CNT = 1u << 10,
  QP_RNR_RETRY = 1u << 11,
  QP_RQ_PSN = 1u << 12,
  QP_MAX_QP_RD_ATOMIC = 1u << 13,
  QP_ALT_PATH = 1u << 14,
  QP_MIN_RNR_TIMER = 1u << 15,
  QP_SQ_PSN = 1u << 16,
  QP_MAX_DEST_RD_ATOMIC = 1u << 17,
  QP_PATH_MIG_STATE = 1u << 18,
  QP_CAP = 1u << 19,
  QP_DEST_QPN = 1u << 20,
};

// IBV_ACCESS_* bits.
enum AccessFlags : uint32_t {
  ACCESS_LOCAL_WRITE = 1u << 0,
  ACCESS_REMOTE_WRITE = 1u << 1,
  ACCESS_REMOTE_READ = 1u << 2,
  ACCESS_REMOTE_ATOMIC = 1u << 3,
};

// IBV_WC_* status, same order and values as libibverbs.
enum class WcStatus {
  SUCCESS,
  LOC_LEN_ERR,
  LOC_QP_OP_ERR,
  LOC_EEC_OP_ERR,
  LOC_PROT_ERR,
  WR_FLUSH_ERR,
  MW_BIND_ERR,
  BAD_RESP_ERR,
  LOC_ACCESS_ERR,
  REM_INV_REQ_ERR,
  REM_ACCESS_ERR,
  REM_OP_ERR,
  RETRY_EXC_ERR,
  RNR_RETRY_EXC_ERR,
  LOC_RDD_VIOL_ERR,
  REM_INV_RD_REQ_ERR,
  REM_ABORT_ERR,
  INV_EECN_ERR,
  INV_EEC_STATE_ERR,
  FATAL_ERR,
  RESP_TIMEOUT_ERR,
  GENERAL_ERR,
};

// Send-side opcodes (IBV_WR_*), the subset the engine models.
enum class WrOpcode { SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ };

// IBV_WC_* opcodes.
enum class WcOpcode { SEND, RDMA_WRITE, RDMA_READ, RECV, RECV_RDMA_WITH_IMM };

enum class AsyncEventType {
  CQ_ERR,
  QP_FATAL,
  QP_REQ_ERR,
  QP_ACCESS_ERR,
  COMM_EST,
  SQ_DRAINED,
  PATH_MIG,
  PATH_MIG_ERR,
  DEVICE_FATAL,
  PORT_ACTIVE,
  PORT_ERR,
  LID_CHANGE,
  PKEY_CHANGE,
  SM_CHANGE,
  SRQ_ERR,
  SRQ_LIMIT_REACHED,
  QP_LAST_WQE_REACHED,
  CLIENT_REREGISTER,
  GID_CHANGE,
};

// What an async event is affiliated with (semantics.md E).
enum class ObjectKind { NONE, DEVICE, PORT, CQ, QP, SRQ, XRCD, PD, MR };

// XRC TGT QP lifetime (semantics.md D): kHandle = lives while any handle is open (today's
// kernel); kXrcd = lives until the XRCD's last reference (2007 proposal / 2011 commit).
enum class XrcTgtLifetime { kHandle, kXrcd, kUnknown };

// What a provider does with a post to a QP in ERR (semantics.md C, seed 000).
enum class ErrPostPolicy {
  kFlush,        // accepted, completed with WR_FLUSH_ERR (IB, mlx5, rxe, kernel siw)
  kRefuse,       // the post fails with EINVAL (user-space libcxgb4)
  kFlushAtOnce,  // completed at once as a flush (kernel siw QPs: siw_post_send in ERROR)
  // Accepted but never processed nor flushed: libsiw writes the WR into the user-mapped SQ and
  // rings a doorbell carrying no WR, and siw_post_send flushes only WRs it is given; libsiw's
  // post_recv is refused (EAGAIN). Seen on siw in the VM lab, Linux 6.1.
  kStrand,
};

// How a device hands out QP numbers (the model's allocator follows it: model/device.cc).
enum class QpnPolicy {
  kIncrement,  // next number, never reused until the space wraps (mlx5, rxe's cyclic xarray)
  kLifo,       // a freed QPN goes to the next create (mana, seed 002)
  kUnknown,    // no source says (a real device of a driver whose row has none)
};

struct Gid {
  std::array<uint8_t, 16> raw{};
  bool operator==(const Gid&) const = default;
  std::string str() const;  // "fe80:0000:...:0001"
};

struct DeviceCaps {
  std::string name;  // "mlx5_0", "rxe0", "model-ib0"
  std::string
      personality;  // model: "ib", "roce", "iwarp-cxgb4", "iwarp-siw", "mana"; verbs: driver name
  Transport transport = Transport::IB;
  bool xrc = false;
  bool srq = true;
  bool ud = true;
  uint64_t node_guid = 0;
  uint32_t max_qp = 0;
  uint32_t max_qp_wr = 0;
  uint32_t max_sge = 0;
  uint32_t max_cq = 0;
  uint32_t max_cqe = 0;
  uint32_t max_srq = 0;
  uint32_t max_srq_wr = 0;
  uint32_t max_mr = 0;
  uint8_t phys_port_cnt = 1;
  ErrPostPolicy err_post = ErrPostPolicy::kFlush;
  XrcTgtLifetime xrc_tgt_lifetime = XrcTgtLifetime::kUnknown;
  // retry_cnt 7 treated as infinite (rxe, rxe_comp.c); the IB spec makes 7 infinite only for
  // rnr_retry.
  bool retry_cnt_7_infinite = false;
  // ibv_query_qp reports the QP's state (siw_query_qp never fills it: always RESET).
  bool reports_qp_state = true;
  QpnPolicy qpn_policy = QpnPolicy::kUnknown;
  // ibv_device_attr.local_ca_ack_delay: the IB CM puts it in REQ/REP and derives the local ACK
  // timeout and the TIMEWAIT time from it (cm.c cm_ack_timeout).
  uint8_t local_ca_ack_delay = 16;
  // The host kernel's CONFIG_HZ: its timers (CM MAD timeouts, TIMEWAIT) run on jiffy ticks and
  // the timer wheel's buckets (rdmalab/kernel_timer.h). 0 = unknown.
  uint16_t kernel_hz = 0;
  // Provider facts no specification settles (bindings/rdmalab/findings.toml, kind
  // provider-fact); the model's personality predicts each, scenarios assert it per device.
  // Removal (rdma link delete, unbind) disassociates user contexts and raises DEVICE_FATAL only
  // where the driver has disassociate_ucontext (uverbs_main.c ib_uverbs_remove_one); otherwise
  // it waits until every user closes the device, and raises nothing.
  bool disassociates = true;
  // A SEND/WRITE completes once handed to the transport (siw: local delivery to TCP,
  // siw_qp_tx.c), not when the peer acknowledged it.
  bool send_completes_on_handoff = false;
  // rdma_connect does the TCP connect itself (siw_cm.c siw_connect, blocking): a refused or
  // unanswered connect fails the call (ECONNREFUSED / ETIMEDOUT), no event.
  bool connect_is_synchronous = false;
  // iWARP graceful close (rdma_disconnect): 0 = the closer gets DISCONNECTED(0) at once (siw
  // releases its socket); else the endpoint timer, in s, after which an unanswered close ends
  // in DISCONNECTED(-ETIMEDOUT) and an abort (cxgb4 ep_timeout_secs 60).
  uint16_t iw_close_timeout_s = 0;
  // A connected QP reaches RTS only through the CM: on iWARP the CM hands the QP its
  // connection (siw_qp.c siw_qp_nextstate_from_idle and cxgb4 qp.c c4iw_modify_qp refuse RTS
  // without the LLP handle, EINVAL), so ibv_modify_qp with the peer's attributes cannot. The
  // model's iWARP personalities say false: their QPs take the peer in modify's attributes
  // (model/qp_state_table.cc check_modify, iWARP; stack/connect.cc bring_up), a convenience of
  // the model for the engine's bring_up, not a kernel fact. rdmalab.api.resources (RCPair)
  // connects through rdma_cm where it is true.
  bool rts_needs_cm = false;
  // A packet the sending host's own stack refuses (ip_local_out fails) is resent under a
  // mechanism that races with the skb's destructor, so the outcome differs from run to run
  // (rxe before 6.12: need_req_skb). The model's personalities say false: they model no host
  // network stack that could refuse a send.
  bool refused_send_resend_races = false;
  // net.ipv4.tcp_syn_retries of the host (TCP_SYN_RETRIES 6): a connect that gets no SYN-ACK
  // gives up after (2^(n+1) - 1) s (TCP_TIMEOUT_INIT 1 s, doubling; 6.1 tcp_write_timeout).
  uint8_t tcp_syn_retries = 6;
  // Async events the provider is known to raise; empty means unknown (real devices).
  std::vector<AsyncEventType> raises;
  bool raises_event(AsyncEventType t) const;
};

struct QpCap {
  uint32_t max_send_wr = 16;
  uint32_t max_recv_wr = 16;
  uint32_t max_send_sge = 1;
  uint32_t max_recv_sge = 1;
  uint32_t max_inline_data = 0;
};

// Address vector (ibv_ah_attr, RoCE/IB global routing collapsed to the fields the model needs).
struct AhAttr {
  Gid dgid;
  uint16_t dlid = 0;
  uint8_t sgid_index = 0;
  uint8_t port_num = 1;
  uint8_t sl = 0;
};

struct QpAttr {
  QpState qp_state = QpState::RESET;
  QpState cur_qp_state = QpState::RESET;
  uint32_t qp_access_flags = 0;
  uint16_t pkey_index = 0;
  uint8_t port_num = 1;
  uint32_t qkey = 0;
  AhAttr ah_attr;
  uint32_t path_mtu = 1024;  // bytes
  uint32_t dest_qp_num = 0;
  uint32_t rq_psn = 0;
  uint32_t sq_psn = 0;
  uint8_t max_rd_atomic = 1;
  uint8_t max_dest_rd_atomic = 1;
  uint8_t min_rnr_timer = 12;  // IBA encoded (12 = 0.64 ms)
  uint8_t timeout = 14;        // 4.096 us * 2^timeout
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;  // 7 = infinite (IBA)
  bool en_sqd_async_notify = false;
  bool sq_draining = false;  // output of query
  QpCap cap;                 // output of query
};

struct Sge {
  uint64_t addr = 0;  // offset into the MR named by lkey (model) or a virtual address (verbs)
  uint32_t length = 0;
  uint32_t lkey = 0;
};

struct SendWr {
  uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::SEND;
  std::vector<Sge> sg_list;
  bool signaled = true;
  uint32_t imm_data = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  // UD
  std::optional<AhAttr> ah;
  uint32_t remote_qpn = 0;
  uint32_t remote_qkey = 0;
  // XRC_SEND: which SRQ on the target receives (ibv_wr_set_xrc_srqn)
  uint32_t remote_srqn = 0;
};

struct RecvWr {
  uint64_t wr_id = 0;
  std::vector<Sge> sg_list;
};

struct WorkCompletion {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::SUCCESS;
  WcOpcode opcode = WcOpcode::SEND;  // valid only on SUCCESS (ibv_wc.opcode)
  uint32_t vendor_err = 0;
  uint32_t byte_len = 0;
  uint32_t imm_data = 0;
  uint32_t qp_num = 0;
  uint32_t src_qp = 0;
  bool with_imm = false;
};

struct AsyncEvent {
  AsyncEventType type = AsyncEventType::QP_FATAL;
  ObjectKind kind = ObjectKind::NONE;
  // Identity of the affiliated object: its engine id (never reused, like uverbs' user_handle)
  // and its wire number (QPN, SRQN), which a device such as mana may hand out again.
  uint64_t object_id = 0;
  uint32_t qp_num = 0;
  uint32_t srq_num = 0;
  uint8_t port_num = 0;
  uint64_t seq = 0;  // per context, for ack bookkeeping
};

struct SrqInitAttr {
  uint32_t max_wr = 64;
  uint32_t max_sge = 1;
  uint32_t srq_limit = 0;
};

std::string_view to_string(Transport t);
std::string_view to_string(QpType t);
std::string_view to_string(QpState s);
std::string_view to_string(WcStatus s);
std::string_view to_string(WcOpcode o);
std::string_view to_string(WrOpcode o);
std::string_view to_string(AsyncEventType t);
std::string_view to_string(ObjectKind k);
std::string_view to_string(XrcTgtLifetime l);
std::string_view to_string(ErrPostPolicy p);
std::string_view to_string(QpnPolicy p);

// Inverse of to_string; throw rdmalab::Error(EINVAL) on an unknown name.
Transport transport_from_string(std::string_view s);
QpType qp_type_from_string(std::string_view s);
QpState qp_state_from_string(std::string_view s);
WrOpcode wr_opcode_from_string(std::string_view s);
AsyncEventType async_event_from_string(std::string_view s);

// The affiliation of each event type (QP_FATAL -> QP, CQ_ERR -> CQ, PORT_ERR -> PORT, ...).
ObjectKind affiliation(AsyncEventType t);

// IB CM MAD attribute IDs (IBA Vol 1 chapter 12.6; the kernel's include/rdma/ib_cm.h
// CM_*_ATTR_ID): the one table behind the CM message names of the model, the metrics classifier
// and the fault switch. constexpr so that model/cm_msg.h can check its enum against it, and so
// that faults/ needs this header only, none of the base library's objects.
struct CmAttr {
  uint16_t id;
  const char* name;
};
inline constexpr std::array<CmAttr, 11> kCmAttrs = {{{0x10, "REQ"},
                                                     {0x11, "MRA"},
                                                     {0x12, "REJ"},
                                                     {0x13, "REP"},
                                                     {0x14, "RTU"},
                                                     {0x15, "DREQ"},
                                                     {0x16, "DREP"},
                                                     {0x17, "SIDR_REQ"},
                                                     {0x18, "SIDR_REP"},
                                                     {0x19, "LAP"},
                                                     {0x1A, "APR"}}};

// "REQ" for 0x10, ... "APR" for 0x1A; nullptr for an ID that names no CM message.
constexpr const char* cm_attr_name(uint16_t attr_id) {
  for (const CmAttr& a : kCmAttrs) {
    if (a.id == attr_id) return a.name;
  }
  return nullptr;
}

// The inverse: 0x16 for "DREP"; nullopt for a name not in the table.
constexpr std::optional<uint16_t> cm_attr_id(std::string_view name) {
  for (const CmAttr& a : kCmAttrs) {
    if (name == a.name) return a.id;
  }
  return std::nullopt;
}

}  // namespace rdmalab
