// Wire faults on the model with the fault switch's own rule engine (faults/rules.h, RuleSet):
// one parser, one validation and one matcher for every backend. The model's packets carry names
// ("SEND_ONLY", "MAD", "TCP_FIN"); wire_frame() presents each as the faults::Frame the switch
// would parse from the frame it stands for, so a rule means the same on the model and on a
// wire. What a model packet stands for, in one place:
//
//   every host      a MAC 02:00:00:00:HH:LL and an IPv4 10.0.HH.LL (HHLL = its index + 1),
//                   bound to its name: src_host, dst_host and direction work as on the switch
//   IB and RoCE     IPv4 + UDP, both ports 4791 (the model has no UDP source-port entropy, so
//                   port=4791 matches every packet and no other port any), a BTH whose opcode
//                   byte is the packet's transport (Packet::qp_type: RC, UD, XRC) and operation
//                   name; UD: a DETH (src_qpn); ACKNOWLEDGE and RDMA_READ_RESPONSE_ONLY: an AETH
//                   (the read response's says ACK); "MAD": a UD SEND_ONLY to QP 1 with a DETH
//                   (src QP 1) and a CM-class MAD with the packet's attribute ID
//   iWARP host      IPv4 + TCP with no ports (the model does not model TCP's ports: a rule with
//                   port= is refused in a lab with an iWARP host). TCP_FIN is FIN|ACK, TCP_RST
//                   RST|ACK, TCP_SYN SYN, TCP_SYN_ACK SYN|ACK, TCP_ACK and every other segment
//                   ACK (no PSH, URG, ECE, CWR); MPA_REQUEST / MPA_REPLY carry that MPA message;
//                   a data packet is one FPDU: SEND_ONLY(_WITH_IMMEDIATE) SEND, RDMA_WRITE_ONLY
//                   (_WITH_IMMEDIATE) RDMA_WRITE, RDMA_READ_REQUEST, RDMA_READ_RESPONSE_ONLY
//                   RDMA_READ_RESPONSE (the immediate, a message of its own in RFC 7306, is
//                   folded in); an ACKNOWLEDGE with a responder error (NAK_INV_REQ,
//                   NAK_REM_ACCESS, NAK_REM_OP, NAK_INV_RD_REQ) is a TERMINATE, any other one a
//                   pure TCP ACK. No BTH: opcode="SEND_ONLY" matches no iWARP packet, as on the
//                   switch.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "faults/frame.h"
#include "faults/ruleset.h"
#include "rdmalab/model.h"

namespace rdmalab::model {

// How the fabric sees a host: its synthetic addresses and whether its packets are TCP (iWARP).
struct WireHost {
  faults::Host addr;
  bool iwarp = false;
};

// The addresses of the index-th host the fabric knows (0-based).
WireHost wire_host(size_t index, bool iwarp);

// The frame pkt stands for, sent from src to dst (nullptr: a host the fabric does not know,
// which gets no addresses).
faults::Frame wire_frame(const Packet& pkt, const WireHost* src, const WireHost* dst);

// The fabric's rules: a RuleSet (seeded from the lab's seed) and the hosts it knows.
class WireRules {
 public:
  explicit WireRules(uint64_t seed) : rules_(seed, kHistoryCap) {}

  // Binds name to the next synthetic MAC and IPv4.
  void add_host(const std::string& name, bool iwarp);

  // Throws faults::RuleError: a bad rule (faults/rules.h), an action the model cannot apply
  // (corrupt), or port= in a lab with an iWARP host.
  uint64_t add(const nlohmann::json& spec);
  bool remove(uint64_t id);
  size_t clear();
  bool empty() const { return count_ == 0; }

  // The first rule that takes pkt (watch rules count it and pass it on); nullopt: deliver.
  std::optional<faults::Decision> decide(const Packet& pkt, TimeNs now_ns);

  // [{"id", "rule", "matched", "acted"}] in order (RuleSet::rules_json).
  nlohmann::json rules_json() const { return rules_.rules_json(); }

 private:
  // The model's history records what the fabric did; the RuleSet keeps few records of its own.
  static constexpr size_t kHistoryCap = 16;

  faults::RuleSet rules_;
  std::map<std::string, WireHost> hosts_;
  faults::Hosts bound_;
  bool any_iwarp_ = false;
  size_t count_ = 0;  // rules in rules_: none, and no frame is built
};

}  // namespace rdmalab::model
