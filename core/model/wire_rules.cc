#include "model/wire_rules.h"

#include <array>
#include <string_view>
#include <utility>

#include "faults/rules.h"

namespace rdmalab::model {
namespace {

using faults::Frame;
namespace tcp_flag = faults::tcp_flag;

constexpr uint8_t kIpProtoTcp = 6, kIpProtoUdp = 17;
constexpr uint8_t kUdSendOnly = 0x64;  // IBTA 9.2: UD (0x60) | SEND_ONLY (0x04)

// The operation bits (4-0) of a BTH opcode name, as the switch names them.
std::optional<uint8_t> operation_of(std::string_view name) {
  static const auto table = [] {
    std::map<std::string, uint8_t, std::less<>> t;
    for (uint8_t low = 0; low < 0x20; ++low) {
      if (const char* n = faults::bth_opcode_name(low)) t.emplace(n, low);
    }
    return t;
  }();
  const auto it = table.find(name);
  if (it == table.end()) return std::nullopt;
  return it->second;
}

uint8_t transport_bits(QpType t) {
  switch (t) {
    case QpType::UD:
      return 0x60;
    case QpType::XRC_SEND:
    case QpType::XRC_RECV:
      return 0xA0;
    case QpType::RC:
      break;
  }
  return 0x00;
}

// IBTA 9.7.5.1 AETH syndrome: ACK 000xxxxx, RNR NAK 001xxxxx, NAK 011 + the code.
uint8_t syndrome_byte(std::string_view s) {
  constexpr std::array<std::pair<std::string_view, uint8_t>, 6> kNaks = {
      {{"RNR_NAK", 0x20},
       {"NAK_SEQ", 0x60},
       {"NAK_INV_REQ", 0x61},
       {"NAK_REM_ACCESS", 0x62},
       {"NAK_REM_OP", 0x63},
       {"NAK_INV_RD_REQ", 0x64}}};
  for (const auto& [name, b] : kNaks)
    if (s == name) return b;
  return 0x00;  // ACK
}

bool is_terminate(std::string_view syndrome) {
  return syndrome == "NAK_INV_REQ" || syndrome == "NAK_REM_ACCESS" || syndrome == "NAK_REM_OP" ||
         syndrome == "NAK_INV_RD_REQ";
}

// RFC 5040 4.2: the RDMAP message a model data packet is on an iWARP connection.
std::optional<uint8_t> rdmap_of(const Packet& p) {
  constexpr std::array<std::pair<std::string_view, uint8_t>, 6> kRdmap = {{
      {"RDMA_WRITE_ONLY", 0x0},
      {"RDMA_WRITE_ONLY_WITH_IMMEDIATE", 0x0},
      {"RDMA_READ_REQUEST", 0x1},
      {"RDMA_READ_RESPONSE_ONLY", 0x2},
      {"SEND_ONLY", 0x3},
      {"SEND_ONLY_WITH_IMMEDIATE", 0x3},
  }};
  if (p.opcode == "ACKNOWLEDGE") {
    if (is_terminate(p.syndrome)) return 0x7;
    return std::nullopt;
  }
  for (const auto& [name, op] : kRdmap)
    if (p.opcode == name) return op;
  return std::nullopt;
}

// The iWARP CM's TCP segments (cm_iw.h IwWire kinds) and their flags: a RST is RST|ACK (Linux
// tcp_send_active_reset), a FIN FIN|ACK.
std::optional<uint8_t> cm_tcp_flags(std::string_view opcode) {
  constexpr std::array<std::pair<std::string_view, uint8_t>, 7> kFlags = {{
      {"TCP_FIN", tcp_flag::FIN | tcp_flag::ACK},
      {"TCP_RST", tcp_flag::RST | tcp_flag::ACK},
      {"TCP_ACK", tcp_flag::ACK},
      {"TCP_SYN", tcp_flag::SYN},
      {"TCP_SYN_ACK", tcp_flag::SYN | tcp_flag::ACK},
      {"MPA_REQUEST", tcp_flag::ACK},
      {"MPA_REPLY", tcp_flag::ACK},
  }};
  for (const auto& [name, bits] : kFlags)
    if (opcode == name) return static_cast<uint8_t>(bits);
  return std::nullopt;
}

constexpr size_t kMpaHeaderBytes = 20;        // RFC 5044 7.1: key, flags, revision, PD length
constexpr size_t kFpduOverhead = 2 + 18 + 4;  // ULPDU length, untagged DDP/RDMAP header, CRC

void tcp_part(Frame& f, const Packet& p) {
  faults::Tcp tcp;
  const auto cm = cm_tcp_flags(p.opcode);
  tcp.flags = cm.value_or(tcp_flag::ACK);  // after the handshake every segment carries ACK
  if (p.opcode == "MPA_REQUEST" || p.opcode == "MPA_REPLY") {
    f.mpa = faults::MpaRr{};
    f.mpa->request = p.opcode == "MPA_REQUEST";
    f.mpa->pd_len = static_cast<uint16_t>(p.length);
    f.mpa->pd_complete = true;
    tcp.payload_len = kMpaHeaderBytes + p.length;
  } else if (const std::optional<uint8_t> op = cm ? std::nullopt : rdmap_of(p); op) {
    f.fpdu = faults::Fpdu{};
    f.fpdu->rdmap_opcode = *op;
    f.fpdu->last = true;
    f.fpdu_count = 1;
    tcp.payload_len = kFpduOverhead + p.length;
  }
  f.tcp = tcp;
  f.ip->protocol = kIpProtoTcp;
}

void roce_part(Frame& f, const Packet& p) {
  f.udp = faults::Udp{0, faults::kRoceV2Port, faults::kRoceV2Port, 0, 0};
  f.ip->protocol = kIpProtoUdp;
  faults::Bth bth;
  bth.dest_qpn = p.dest_qpn;
  bth.psn = p.psn;
  if (p.opcode == "MAD") {
    bth.opcode = kUdSendOnly;
    f.deth = faults::Deth{0, 0, p.src_qpn};
    f.mad = faults::Mad{};
    f.mad->mgmt_class = faults::kMgmtClassCm;
    f.mad->attr_id = p.mad_attr_id;
    f.mad->len = 256;
  } else {
    const auto op = operation_of(p.opcode);
    if (!op) return;  // no such operation: the switch could not parse a BTH either
    bth.opcode = static_cast<uint8_t>(transport_bits(p.qp_type) | *op);
    if (p.qp_type == QpType::UD) f.deth = faults::Deth{0, 0, p.src_qpn};
    if (p.opcode == "ACKNOWLEDGE" || p.opcode == "RDMA_READ_RESPONSE_ONLY")
      f.aeth = faults::Aeth{0, syndrome_byte(p.syndrome), 0};
  }
  f.bth = bth;
  f.roce_payload_len = p.length;
}

}  // namespace

Frame wire_frame(const Packet& pkt, const WireHost* src, const WireHost* dst) {
  Frame f;
  f.eth = faults::Eth{};
  f.eth->ethertype = 0x0800;
  f.ip = faults::Ip{};
  f.ip->version = 4;
  if (src != nullptr) {
    f.eth->src = *src->addr.mac;
    f.ip->src = src->addr.ip->src;
  }
  if (dst != nullptr) {
    f.eth->dst = *dst->addr.mac;
    f.ip->dst = dst->addr.ip->src;  // a Host keeps its address in .src
  }
  if (src != nullptr && src->iwarp) {
    tcp_part(f, pkt);
  } else {
    roce_part(f, pkt);
  }
  return f;
}

WireHost wire_host(size_t index, bool iwarp) {
  const size_t n = index + 1;
  const auto hi = static_cast<uint8_t>(n >> 8), lo = static_cast<uint8_t>(n & 0xFF);
  WireHost h;
  h.iwarp = iwarp;
  h.addr.mac = faults::Mac{0x02, 0, 0, 0, hi, lo};  // locally administered
  faults::Ip ip;
  ip.version = 4;
  ip.src[0] = 10;
  ip.src[2] = hi;
  ip.src[3] = lo;
  h.addr.ip = ip;
  return h;
}

void WireRules::add_host(const std::string& name, bool iwarp) {
  const WireHost h = wire_host(hosts_.size(), iwarp);
  hosts_[name] = h;
  bound_[name] = h.addr;
  any_iwarp_ = any_iwarp_ || iwarp;
  rules_.set_hosts(bound_);
}

uint64_t WireRules::add(const nlohmann::json& spec) {
  faults::Rule r = faults::parse_rule(spec);
  if (r.action == faults::Action::kCorrupt)
    throw faults::RuleError(
        "rule.action: corrupt: the model's fabric carries packets, not bytes: it cannot corrupt "
        "a header (inject_async_event models the effect)");
  if (r.match.port && any_iwarp_)
    throw faults::RuleError(
        "rule.port: the model's iWARP packets carry no TCP ports (TCP is not modelled): match "
        "them with opcode=, tcp_flags= or rdmap_opcode=");
  const uint64_t id = rules_.add(std::move(r));
  ++count_;
  return id;
}

bool WireRules::remove(uint64_t id) {
  if (!rules_.remove(id)) return false;
  --count_;
  return true;
}

size_t WireRules::clear() {
  count_ = 0;
  return rules_.clear();
}

std::optional<faults::Decision> WireRules::decide(const Packet& pkt, TimeNs now_ns) {
  if (count_ == 0) return std::nullopt;
  const auto find = [this](const std::string& name) -> const WireHost* {
    const auto it = hosts_.find(name);
    return it == hosts_.end() ? nullptr : &it->second;
  };
  return rules_.decide(wire_frame(pkt, find(pkt.src_host), find(pkt.dst_host)),
                       static_cast<uint64_t>(now_ns));
}

}  // namespace rdmalab::model
