// IB CM messages as the model carries them (IBA Vol 1 chapter 12.6; the kernel's cm_msgs.h), the
// CM time encodings, and the names the history and wire faults use. Every message is one MAD to
// QP1 (management class 0x07): on the fabric a Packet with opcode "MAD", dest_qpn 1 and the
// attribute ID below, so a wire fault can match it (vmlab.md, rxe: UD SEND_ONLY to QP1).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rdmalab/types.h"

namespace rdmalab::model {

// MAD attribute IDs (include/rdma/ib_cm.h CM_*_ATTR_ID): the messages the model sends, with
// the values of rdmalab/types.h kCmAttrs, whose names cm_msg_name returns.
enum class CmMsgType : uint16_t {
  REQ = 0x10,
  MRA = 0x11,
  REJ = 0x12,
  REP = 0x13,
  RTU = 0x14,
  DREQ = 0x15,
  DREP = 0x16,
};

// The enum spells the IDs again (switch statements want an enum): tie each to the table's name.
constexpr bool cm_msg_type_is(CmMsgType t, std::string_view name) {
  const char* n = cm_attr_name(static_cast<uint16_t>(t));
  return n != nullptr && name == n;
}
static_assert(cm_msg_type_is(CmMsgType::REQ, "REQ") && cm_msg_type_is(CmMsgType::MRA, "MRA") &&
              cm_msg_type_is(CmMsgType::REJ, "REJ") && cm_msg_type_is(CmMsgType::REP, "REP") &&
              cm_msg_type_is(CmMsgType::RTU, "RTU") && cm_msg_type_is(CmMsgType::DREQ, "DREQ") &&
              cm_msg_type_is(CmMsgType::DREP, "DREP"));

const char* cm_msg_name(CmMsgType t);  // the table's name: "REQ", ... "DREP"

// What an MRA or REJ names as the message it answers (cm_msgs.h CM_MSG_RESPONSE_*).
enum class CmMsgResponse : uint8_t { REQ = 0, REP = 1, OTHER = 2 };

// One CM message. The fields are the union of the messages the model sends; each message uses
// the ones its IBA layout has (named as in cm_msgs.h), the rest stay zero.
struct CmMsg {
  CmMsgType type = CmMsgType::REQ;
  uint32_t local_comm_id = 0;   // every message: the sender's communication ID
  uint32_t remote_comm_id = 0;  // every message but REQ: the receiver's communication ID
  // REQ
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;  // REQ, REP
  uint32_t local_qpn = 0;      // REQ, REP
  uint32_t starting_psn = 0;   // REQ, REP
  uint8_t remote_cm_response_timeout = 0;
  uint8_t local_cm_response_timeout = 0;
  uint8_t max_cm_retries = 0;
  uint8_t packet_life_time = 0;  // primary path
  uint8_t primary_local_ack_timeout = 0;
  uint8_t responder_resources = 0;  // REQ, REP
  uint8_t initiator_depth = 0;      // REQ, REP
  uint8_t retry_count = 0;          // REQ
  uint8_t rnr_retry_count = 0;      // REQ, REP
  // REP
  uint8_t target_ack_delay = 0;
  // MRA
  CmMsgResponse msg_mraed = CmMsgResponse::REQ;
  uint8_t service_timeout = 0;
  // REJ
  CmMsgResponse msg_rejected = CmMsgResponse::REQ;
  int reason = 0;
  // DREQ: the QPN the sender believes the receiver holds (IBA 12.9.8.3.1: stale QPN)
  uint32_t remote_qpn = 0;
  std::vector<uint8_t> private_data;
  Gid src_gid;  // from the GRH: where answers go
};

// cm.c cm_convert_to_ms: 4.096 us * 2^t, approximated as 2^(t-8) ms.
inline int64_t cm_convert_to_ms(int iba_time) {
  return int64_t{1} << std::max(iba_time - 8, 0);
}

// cm.c cm_ack_timeout: the local ACK timeout from the CA ACK delay and the packet lifetime.
inline uint8_t cm_ack_timeout(uint8_t ca_ack_delay, uint8_t packet_life_time) {
  int ack_timeout = packet_life_time + 1;
  if (ack_timeout >= ca_ack_delay) {
    ack_timeout += (ca_ack_delay >= ack_timeout - 1) ? 1 : 0;
  } else {
    ack_timeout = ca_ack_delay + ((ack_timeout >= ca_ack_delay - 1) ? 1 : 0);
  }
  return static_cast<uint8_t>(std::min(31, ack_timeout));
}

// rdma_cm's MRA setting (cma.c CMA_CM_MRA_SETTING = IB_CM_MRA_FLAG_DELAY | 24): the service
// timeout an MRA announces; the flag makes ib_send_cm_mra send it only on a duplicate.
inline constexpr uint8_t kCmaMraServiceTimeout = 24;

}  // namespace rdmalab::model
