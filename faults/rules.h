// The wire-fault rule language, one JSON object per rule; the model's fabric applies the same
// RuleSet to the frame each of its packets stands for (core/model/wire_rules.h). A rule matches a
// frame when every key it names matches:
//
//   proto        "roce" | "tcp" | "iwarp" (MPA request/reply or FPDUs) | "any"
//   src_host, dst_host   names bound to a MAC and/or an IP by {"op":"hosts"}; a frame is from a
//                host when its source MAC or source IP is the host's
//   direction    "a->b" (src_host a, dst_host b) or "a<->b" (either way)
//   opcode       BTH operation name ("SEND_ONLY", "ACKNOWLEDGE": any transport) or the opcode
//                byte as an integer; "MAD" for a UD SEND to QP 1 carrying a MAD (as on the model's
//                fabric such a frame is "MAD" only, not "SEND_ONLY"; 0x64 matches it); for TCP the
//                model's names "MPA_REQUEST", "MPA_REPLY", "TCP_SYN", "TCP_FIN", "TCP_RST",
//                "TCP_ACK" (a pure ACK: no payload, no SYN/FIN/RST)
//   transport    "RC", "UC", "RD", "UD", "CNP", "XRC"
//   dest_qpn, psn        BTH fields; src_qpn: the DETH's source QP (UD and CM frames only)
//   syndrome     AETH: "ACK", "RNR_NAK", "NAK_SEQ", "NAK_INV_REQ", "NAK_REM_ACCESS",
//                "NAK_REM_OP", "NAK_INV_RD_REQ"
//   mad_attr_id  integer; cm: "REQ" ... "DREP", "SIDR_REQ", "SIDR_REP", "LAP", "APR" (opcode MAD,
//                management class CM, that attribute ID)
//   tcp_flags    "FIN", "SYN|ACK", ...: those bits set, others free
//   rdmap_opcode "RDMA_WRITE", "RDMA_READ_REQUEST", "RDMA_READ_RESPONSE", "SEND",
//                "SEND_WITH_INVALIDATE", "SEND_WITH_SE", "SEND_WITH_SE_AND_INVALIDATE",
//                "TERMINATE", or the 4-bit value
//   port         a UDP or TCP port, source or destination
//
// Action ("action"): "drop"; "delay" with delay_ns; "duplicate"; "reorder" with hold_ns
// (default 100 ms): hold the frame until the next frame of its flow passes, then send it after
// that one, or send it at the deadline; "corrupt" with layer, offset, xor (1..255, default 255)
// (corrupt.h; a corrupt rule matches only frames that have the byte); "watch": count and record
// the frame and let it go on to the next rule (the model's watch). How often: count (act on
// the first N frames it takes), every (take every Kth match), probability (0..1, from the
// switch's seeded generator, one stream per rule id). A rule whose count is spent, or that
// skips a frame by every/probability, lets the frame go on to the next rule; the first rule
// that takes the frame decides.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "faults/corrupt.h"
#include "faults/frame.h"

namespace rdmalab::faults {

// A bad rule or hosts object; the message names the field ("rule.delay_ns: ...").
class RuleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Action : uint8_t { kDrop, kDelay, kDuplicate, kReorder, kCorrupt, kWatch };
inline constexpr std::array<Action, 6> kActions = {Action::kDrop,      Action::kDelay,
                                                   Action::kDuplicate, Action::kReorder,
                                                   Action::kCorrupt,   Action::kWatch};
const char* action_name(Action a);

enum class Proto : uint8_t { kAny, kRoce, kTcp, kIwarp };

struct Host {
  std::optional<Mac> mac;
  std::optional<Ip> ip;  // version and src filled
};
using Hosts = std::map<std::string, Host>;
Hosts parse_hosts(const nlohmann::json& j);  // {"a": {"mac": "52:54:..", "ip": "10.0.0.1"}}
nlohmann::json hosts_json(const Hosts& h);

struct Match {
  Proto proto = Proto::kAny;
  std::optional<std::string> src_host, dst_host;
  bool either_direction = false;      // "a<->b"
  std::optional<std::string> opcode;  // a name
  std::optional<uint8_t> opcode_value;
  std::optional<std::string> transport;
  std::optional<uint32_t> dest_qpn, src_qpn, psn;
  std::optional<std::string> syndrome;
  std::optional<uint16_t> mad_attr_id;
  bool cm_class = false;  // set by "cm": the MAD must be of the CM class
  std::optional<uint8_t> tcp_flags;
  std::optional<uint8_t> rdmap_opcode;
  std::optional<uint16_t> port;
};

struct Rule {
  uint64_t id = 0;  // given by RuleSet::add
  Match match;
  Action action = Action::kDrop;
  uint64_t delay_ns = 0;
  uint64_t hold_ns = 100'000'000;
  CorruptSpec corrupt;
  std::optional<uint64_t> count;
  uint64_t every = 1;
  uint32_t probability_ppm = 1'000'000;  // integer parts per million: replays bit for bit
  nlohmann::json spec;                   // the object as given
};

Rule parse_rule(const nlohmann::json& j);  // throws RuleError

// Every key the rule names matches (hosts resolved through h); counts are not looked at.
bool matches(const Match& m, const Frame& f, const Hosts& h);
// A corrupt rule needs its byte in the frame.
bool applicable(const Rule& r, const Frame& f);

}  // namespace rdmalab::faults
