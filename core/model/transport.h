// Wire vocabulary of the model transports (IBA chapter 9): what travels in one packet beyond
// the header a wire fault sees, PSN arithmetic, the RNR timer encoding and the retransmit timer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rdmalab/model.h"
#include "rdmalab/types.h"

namespace rdmalab::model {

// One packet per message: the header (Packet) and what the BTH/RETH/DETH/XRCETH/AETH and the
// payload carry.
struct Frame {
  Packet pkt;
  QpType qp_type = QpType::RC;
  WrOpcode op = WrOpcode::SEND;  // requests
  std::vector<uint8_t> payload;
  uint64_t remote_addr = 0;  // RETH
  uint32_t rkey = 0;
  uint32_t dma_len = 0;  // RDMA READ request length
  bool has_imm = false;
  uint32_t imm = 0;
  uint32_t qkey = 0;         // DETH (UD)
  uint32_t srqn = 0;         // XRCETH (XRC)
  uint8_t rnr_timer = 0;     // AETH of an RNR NAK
  std::string src_gid_host;  // where responses go for UD (from the GRH)
};

// BTH opcode names as the wire-fault hook sees them.
const char* request_opcode_name(WrOpcode op);
inline constexpr const char* kAckOpcode = "ACKNOWLEDGE";
inline constexpr const char* kReadResponseOpcode = "RDMA_READ_RESPONSE_ONLY";

// 24-bit PSN arithmetic: the signed distance a - b.
inline int32_t psn_diff(uint32_t a, uint32_t b) {
  auto d = static_cast<int32_t>((a - b) & 0xffffff);
  return d >= 0x800000 ? d - 0x1000000 : d;
}
inline uint32_t psn_next(uint32_t p) {
  return (p + 1) & 0xffffff;
}

// Local ACK timeout: 4.096 us * 2^timeout (IBA 9.7.6.1.3); 0 means no timer (infinite).
inline TimeNs ack_timeout_ns(uint8_t timeout) {
  if (timeout == 0) return 0;
  return static_cast<TimeNs>(4096) << (timeout > 31 ? 31 : timeout);
}

// RNR NAK timer field encoding (IBA table 45, ibv_modify_qp(3) min_rnr_timer), in ns.
TimeNs rnr_timer_ns(uint8_t code);

}  // namespace rdmalab::model
