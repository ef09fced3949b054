#include "rdmalab/types.h"

#include <algorithm>
#include <cstdio>

#include "rdmalab/cm.h"
#include "rdmalab/error.h"

namespace rdmalab {

namespace {

// Names in enum order; one table per enum so to_string and from_string cannot disagree.
constexpr std::string_view kTransport[] = {"IB", "RoCE", "iWARP"};
constexpr std::string_view kQpType[] = {"RC", "UD", "XRC_SEND", "XRC_RECV"};
constexpr std::string_view kQpState[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
constexpr std::string_view kWcStatus[] = {
    "SUCCESS",          "LOC_LEN_ERR",       "LOC_QP_OP_ERR",     "LOC_EEC_OP_ERR",
    "LOC_PROT_ERR",     "WR_FLUSH_ERR",      "MW_BIND_ERR",       "BAD_RESP_ERR",
    "LOC_ACCESS_ERR",   "REM_INV_REQ_ERR",   "REM_ACCESS_ERR",    "REM_OP_ERR",
    "RETRY_EXC_ERR",    "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR",  "REM_INV_RD_REQ_ERR",
    "REM_ABORT_ERR",    "INV_EECN_ERR",      "INV_EEC_STATE_ERR", "FATAL_ERR",
    "RESP_TIMEOUT_ERR", "GENERAL_ERR"};
constexpr std::string_view kWcOpcode[] = {"SEND", "RDMA_WRITE", "RDMA_READ", "RECV",
                                          "RECV_RDMA_WITH_IMM"};
constexpr std::string_view kWrOpcode[] = {"SEND", "SEND_WITH_IMM", "RDMA_WRITE",
                                          "RDMA_WRITE_WITH_IMM", "RDMA_READ"};
constexpr std::string_view kAsyncEvent[] = {"CQ_ERR",
                                            "QP_FATAL",
                                            "QP_REQ_ERR",
                                            "QP_ACCESS_ERR",
                                            "COMM_EST",
                                            "SQ_DRAINED",
                                            "PATH_MIG",
                                            "PATH_MIG_ERR",
                                            "DEVICE_FATAL",
                                            "PORT_ACTIVE",
                                            "PORT_ERR",
                                            "LID_CHANGE",
                                            "PKEY_CHANGE",
                                            "SM_CHANGE",
                                            "SRQ_ERR",
                                            "SRQ_LIMIT_REACHED",
                                            "QP_LAST_WQE_REACHED",
                                            "CLIENT_REREGISTER",
                                            "GID_CHANGE"};
constexpr std::string_view kObjectKind[] = {"NONE", "DEVICE", "PORT", "CQ", "QP",
                                            "SRQ",  "XRCD",   "PD",   "MR"};
constexpr std::string_view kCmEvent[] = {
    "ADDR_RESOLVED",   "ADDR_ERROR",       "ROUTE_RESOLVED", "ROUTE_ERROR",
    "CONNECT_REQUEST", "CONNECT_RESPONSE", "CONNECT_ERROR",  "UNREACHABLE",
    "REJECTED",        "ESTABLISHED",      "DISCONNECTED",   "DEVICE_REMOVAL",
    "MULTICAST_JOIN",  "MULTICAST_ERROR",  "ADDR_CHANGE",    "TIMEWAIT_EXIT"};
constexpr std::string_view kXrcLifetime[] = {"handle", "xrcd", "unknown"};
constexpr std::string_view kErrPost[] = {"flush", "refuse", "flush_at_once", "strand"};
constexpr std::string_view kQpnPolicy[] = {"increment", "lifo", "unknown"};

template <typename E, size_t N>
std::string_view name_of(const std::string_view (&names)[N], E v) {
  const auto i = static_cast<size_t>(v);
  return i < N ? names[i] : std::string_view("?");
}

template <typename E, size_t N>
E parse(const std::string_view (&names)[N], std::string_view s, const char* what) {
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == s) return static_cast<E>(i);
  }
  std::string allowed;
  for (size_t i = 0; i < N; ++i) allowed += (i ? ", " : "") + std::string(names[i]);
  throw Error(
      std::string("parse ") + what, EINVAL,
      "unknown " + std::string(what) + " '" + std::string(s) + "' (allowed: " + allowed + ")");
}

// Every CM attribute maps to its name and back: no ID nor name twice.
constexpr bool cm_attrs_round_trip() {
  for (const CmAttr& a : kCmAttrs) {
    if (std::string_view(cm_attr_name(a.id)) != a.name || cm_attr_id(a.name) != a.id) return false;
  }
  return true;
}
static_assert(cm_attrs_round_trip());

}  // namespace

std::string Gid::str() const {
  std::string s;
  char buf[8];
  for (size_t i = 0; i < raw.size(); i += 2) {
    std::snprintf(buf, sizeof buf, "%02x%02x", raw[i], raw[i + 1]);
    if (i) s += ':';
    s += buf;
  }
  return s;
}

bool DeviceCaps::raises_event(AsyncEventType t) const {
  return std::find(raises.begin(), raises.end(), t) != raises.end();
}

std::string_view to_string(Transport t) {
  return name_of(kTransport, t);
}
std::string_view to_string(QpType t) {
  return name_of(kQpType, t);
}
std::string_view to_string(QpState s) {
  return name_of(kQpState, s);
}
std::string_view to_string(WcStatus s) {
  return name_of(kWcStatus, s);
}
std::string_view to_string(WcOpcode o) {
  return name_of(kWcOpcode, o);
}
std::string_view to_string(WrOpcode o) {
  return name_of(kWrOpcode, o);
}
std::string_view to_string(AsyncEventType t) {
  return name_of(kAsyncEvent, t);
}
std::string_view to_string(ObjectKind k) {
  return name_of(kObjectKind, k);
}
std::string_view to_string(CmEventType t) {
  return name_of(kCmEvent, t);
}
CmEventType cm_event_from_string(std::string_view s) {
  return parse<CmEventType>(kCmEvent, s, "rdma_cm event");
}
std::string_view to_string(XrcTgtLifetime l) {
  return name_of(kXrcLifetime, l);
}
std::string_view to_string(ErrPostPolicy p) {
  return name_of(kErrPost, p);
}
std::string_view to_string(QpnPolicy p) {
  return name_of(kQpnPolicy, p);
}

Transport transport_from_string(std::string_view s) {
  return parse<Transport>(kTransport, s, "transport");
}
QpType qp_type_from_string(std::string_view s) {
  return parse<QpType>(kQpType, s, "QP type");
}
QpState qp_state_from_string(std::string_view s) {
  return parse<QpState>(kQpState, s, "QP state");
}
WrOpcode wr_opcode_from_string(std::string_view s) {
  return parse<WrOpcode>(kWrOpcode, s, "WR opcode");
}
AsyncEventType async_event_from_string(std::string_view s) {
  return parse<AsyncEventType>(kAsyncEvent, s, "async event");
}

ObjectKind affiliation(AsyncEventType t) {
  switch (t) {
    case AsyncEventType::CQ_ERR:
      return ObjectKind::CQ;
    case AsyncEventType::QP_FATAL:
    case AsyncEventType::QP_REQ_ERR:
    case AsyncEventType::QP_ACCESS_ERR:
    case AsyncEventType::COMM_EST:
    case AsyncEventType::SQ_DRAINED:
    case AsyncEventType::PATH_MIG:
    case AsyncEventType::PATH_MIG_ERR:
    case AsyncEventType::QP_LAST_WQE_REACHED:
      return ObjectKind::QP;
    case AsyncEventType::SRQ_ERR:
    case AsyncEventType::SRQ_LIMIT_REACHED:
      return ObjectKind::SRQ;
    case AsyncEventType::DEVICE_FATAL:
      return ObjectKind::DEVICE;
    case AsyncEventType::PORT_ACTIVE:
    case AsyncEventType::PORT_ERR:
    case AsyncEventType::LID_CHANGE:
    case AsyncEventType::PKEY_CHANGE:
    case AsyncEventType::SM_CHANGE:
    case AsyncEventType::CLIENT_REREGISTER:
    case AsyncEventType::GID_CHANGE:
      return ObjectKind::PORT;
  }
  return ObjectKind::NONE;
}

}  // namespace rdmalab
