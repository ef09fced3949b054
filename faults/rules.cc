#include "faults/rules.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>

#include "rdmalab/types.h"

namespace rdmalab::faults {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& field, const std::string& msg) {
  throw RuleError(field + ": " + msg);
}

std::string type_of(const json& v) {
  if (v.is_number_float()) return "a float";
  if (v.is_number()) return "an integer";
  return std::string("a ") + v.type_name();
}

uint64_t get_uint(const json& v, const std::string& field, uint64_t max) {
  if (!v.is_number_integer()) fail(field, "expected an integer, got " + type_of(v));
  if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)
    fail(field, "expected an integer >= 0, got " + v.dump());
  const uint64_t n = v.get<uint64_t>();
  if (n > max) fail(field, "expected at most " + std::to_string(max) + ", got " + v.dump());
  return n;
}

std::string get_string(const json& v, const std::string& field) {
  if (!v.is_string()) fail(field, "expected a string, got " + type_of(v));
  return v.get<std::string>();
}

constexpr std::array<const char*, 6> kTcpOpcodes = {"MPA_REQUEST", "MPA_REPLY", "TCP_SYN",
                                                    "TCP_FIN",     "TCP_RST",   "TCP_ACK"};
constexpr std::array<const char*, 7> kSyndromes = {
    "ACK", "RNR_NAK", "NAK_SEQ", "NAK_INV_REQ", "NAK_REM_ACCESS", "NAK_REM_OP", "NAK_INV_RD_REQ"};
constexpr std::array<const char*, 6> kTransports = {"RC", "UC", "RD", "UD", "CNP", "XRC"};

bool known_opcode_name(const std::string& s) {
  if (s == "MAD") return true;
  for (const char* n : kTcpOpcodes)
    if (s == n) return true;
  for (int op = 0; op < 256; ++op) {
    const char* n = bth_opcode_name(static_cast<uint8_t>(op));
    if (n != nullptr && s == n) return true;
  }
  return false;
}

template <size_t N>
bool one_of(const std::string& s, const std::array<const char*, N>& names) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return s == n; });
}

std::string cm_attr_names() {
  std::string s;
  for (const CmAttr& a : kCmAttrs) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

uint8_t parse_tcp_flags(const json& v, const std::string& field) {
  const std::string s = get_string(v, field);
  uint8_t bits = 0;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t bar = std::min(s.find('|', start), s.size());
    const std::string name = s.substr(start, bar - start);
    uint8_t bit = 0;
    for (int b = 0; b < 8; ++b)
      if (name == tcp_flags_string(static_cast<uint8_t>(1 << b)))
        bit = static_cast<uint8_t>(1 << b);
    if (bit == 0)
      fail(field, "unknown TCP flag '" + name + "' (FIN, SYN, RST, PSH, ACK, URG, ECE, CWR)");
    bits |= bit;
    start = bar + 1;
  }
  return bits;
}

uint8_t parse_rdmap_opcode(const json& v, const std::string& field) {
  if (v.is_number_integer()) return static_cast<uint8_t>(get_uint(v, field, 15));
  const std::string s = get_string(v, field);
  for (uint8_t op = 0; op < 16; ++op)
    if (const char* n = rdmap_opcode_name(op); n != nullptr && s == n) return op;
  fail(field, "unknown RDMAP opcode '" + s + "'");
}

Proto parse_proto(const json& v, const std::string& field) {
  const std::string s = get_string(v, field);
  if (s == "roce") return Proto::kRoce;
  if (s == "tcp") return Proto::kTcp;
  if (s == "iwarp") return Proto::kIwarp;
  if (s == "any") return Proto::kAny;
  fail(field, "expected \"roce\", \"tcp\", \"iwarp\" or \"any\", got \"" + s + "\"");
}

void parse_direction(Match& m, const json& v, const std::string& field) {
  const std::string s = get_string(v, field);
  size_t at = s.find("<->");
  size_t len = 3;
  if (at == std::string::npos) {
    at = s.find("->");
    len = 2;
  } else {
    m.either_direction = true;
  }
  if (at == std::string::npos || at == 0 || at + len >= s.size())
    fail(field, "expected \"a->b\" or \"a<->b\", got \"" + s + "\"");
  if (m.src_host || m.dst_host) fail(field, "give either direction or src_host/dst_host");
  m.src_host = s.substr(0, at);
  m.dst_host = s.substr(at + len);
}

// Keys of the match; returns false for a key that is not one.
bool parse_match_key(Match& m, const std::string& key, const json& v, const std::string& field) {
  if (key == "proto") {
    m.proto = parse_proto(v, field);
  } else if (key == "src_host" || key == "dst_host") {
    auto& slot = key == "src_host" ? m.src_host : m.dst_host;
    if (slot) fail(field, "given twice (direction names it too)");
    slot = get_string(v, field);
  } else if (key == "direction") {
    parse_direction(m, v, field);
  } else if (key == "opcode") {
    if (v.is_number_integer()) {
      m.opcode_value = static_cast<uint8_t>(get_uint(v, field, 255));
    } else {
      const std::string s = get_string(v, field);
      if (!known_opcode_name(s)) fail(field, "unknown opcode '" + s + "'");
      if (m.opcode && *m.opcode != s) fail(field, "conflicts with cm (opcode MAD)");
      m.opcode = s;
    }
  } else if (key == "transport") {
    const std::string s = get_string(v, field);
    if (!one_of(s, kTransports)) fail(field, "expected RC, UC, RD, UD, CNP or XRC");
    m.transport = s;
  } else if (key == "dest_qpn" || key == "src_qpn" || key == "psn") {
    auto& slot = key == "dest_qpn" ? m.dest_qpn : key == "src_qpn" ? m.src_qpn : m.psn;
    slot = static_cast<uint32_t>(get_uint(v, field, 0xFFFFFF));
  } else if (key == "syndrome") {
    const std::string s = get_string(v, field);
    if (!one_of(s, kSyndromes)) fail(field, "unknown AETH syndrome '" + s + "'");
    m.syndrome = s;
  } else if (key == "mad_attr_id" || key == "cm") {
    uint16_t id = 0;
    if (key == "cm") {
      const auto a = cm_attr_id(get_string(v, field));
      if (!a) fail(field, "unknown CM message " + v.dump() + " (" + cm_attr_names() + ")");
      id = *a;
      m.cm_class = true;
      if (m.opcode && *m.opcode != "MAD") fail(field, "conflicts with opcode " + *m.opcode);
      m.opcode = "MAD";
    } else {
      id = static_cast<uint16_t>(get_uint(v, field, 0xFFFF));
    }
    if (m.mad_attr_id && *m.mad_attr_id != id)
      fail(field, "conflicts with the other of cm / mad_attr_id");
    m.mad_attr_id = id;
  } else if (key == "tcp_flags") {
    m.tcp_flags = parse_tcp_flags(v, field);
  } else if (key == "rdmap_opcode") {
    m.rdmap_opcode = parse_rdmap_opcode(v, field);
  } else if (key == "port") {
    m.port = static_cast<uint16_t>(get_uint(v, field, 0xFFFF));
  } else {
    return false;
  }
  return true;
}

Action parse_action(const json& j) {
  if (!j.contains("action"))
    fail("rule.action", "missing (drop, delay, duplicate, reorder, corrupt, watch)");
  const std::string s = get_string(j.at("action"), "rule.action");
  for (Action a : kActions)
    if (s == action_name(a)) return a;
  fail("rule.action",
       "unknown action '" + s + "' (drop, delay, duplicate, reorder, corrupt, watch)");
}

// Keys that belong to one action only.
std::optional<Action> owner(const std::string& key) {
  if (key == "delay_ns") return Action::kDelay;
  if (key == "hold_ns") return Action::kReorder;
  if (key == "layer" || key == "offset" || key == "xor") return Action::kCorrupt;
  return std::nullopt;
}

void parse_action_key(Rule& r, const std::string& key, const json& v, const std::string& field) {
  if (owner(key) != r.action)
    fail(field, std::string("only for action ") + action_name(*owner(key)));
  if (key == "delay_ns") {
    r.delay_ns = get_uint(v, field, UINT64_MAX / 2);
  } else if (key == "hold_ns") {
    r.hold_ns = get_uint(v, field, UINT64_MAX / 2);
  } else if (key == "layer") {
    const auto l = layer_from_name(get_string(v, field));
    if (!l) fail(field, "unknown layer " + v.dump() + " (" + layer_names() + ")");
    r.corrupt.layer = *l;
  } else if (key == "offset") {
    r.corrupt.offset = get_uint(v, field, 65535);
  } else {  // xor
    const uint64_t x = get_uint(v, field, 255);
    if (x == 0) fail(field, "0 changes nothing: give 1..255");
    r.corrupt.xor_mask = static_cast<uint8_t>(x);
  }
}

void parse_how_often(Rule& r, const std::string& key, const json& v, const std::string& field) {
  if (key == "count") {
    if (v.is_null()) return;
    r.count = get_uint(v, field, UINT64_MAX);
    if (*r.count == 0) fail(field, "expected at least 1 (or null: no limit)");
  } else if (key == "every") {
    r.every = get_uint(v, field, UINT64_MAX);
    if (r.every == 0) fail(field, "expected at least 1");
  } else {  // probability
    if (!v.is_number()) fail(field, "expected a number in 0..1, got " + type_of(v));
    const double p = v.get<double>();
    if (!(p >= 0.0 && p <= 1.0)) fail(field, "expected a number in 0..1, got " + v.dump());
    r.probability_ppm = static_cast<uint32_t>(p * 1e6 + 0.5);
  }
}

bool host_is(const Host& h, const Frame& f, bool src) {
  if (h.mac && f.eth && (src ? f.eth->src : f.eth->dst) == *h.mac) return true;
  if (!h.ip || !f.ip || f.ip->version != h.ip->version) return false;
  const size_t n = h.ip->version == 6 ? 16 : 4;
  const auto& a = src ? f.ip->src : f.ip->dst;
  return std::memcmp(a.data(), h.ip->src.data(), n) == 0;
}

bool hosts_match(const Match& m, const Frame& f, const Hosts& hosts) {
  const auto is = [&](const std::optional<std::string>& name, bool src) {
    if (!name) return true;
    const auto it = hosts.find(*name);
    return it != hosts.end() && host_is(it->second, f, src);
  };
  if (is(m.src_host, true) && is(m.dst_host, false)) return true;
  return m.either_direction && is(m.src_host, false) && is(m.dst_host, true);
}

// The model's opcode names: a frame that carries a MAD is "MAD", not its BTH operation.
bool opcode_matches(const std::string& name, const Frame& f) {
  if (f.mad) return name == "MAD";
  if (f.bth) {
    const char* n = bth_opcode_name(f.bth->opcode);
    return n != nullptr && name == n;
  }
  if (!f.tcp) return false;
  const uint8_t fl = f.tcp->flags;
  if (name == "MPA_REQUEST") return f.mpa && f.mpa->request;
  if (name == "MPA_REPLY") return f.mpa && !f.mpa->request;
  if (name == "TCP_SYN") return fl & tcp_flag::SYN;
  if (name == "TCP_FIN") return fl & tcp_flag::FIN;
  if (name == "TCP_RST") return fl & tcp_flag::RST;
  if (name == "TCP_ACK")
    return (fl & tcp_flag::ACK) && !(fl & (tcp_flag::SYN | tcp_flag::FIN | tcp_flag::RST)) &&
           f.tcp->payload_len == 0;
  return false;
}

bool proto_matches(Proto p, const Frame& f) {
  switch (p) {
    case Proto::kAny:
      return true;
    case Proto::kRoce:
      return f.bth.has_value();
    case Proto::kTcp:
      return f.tcp.has_value();
    case Proto::kIwarp:
      return f.mpa || f.fpdu;
  }
  return false;
}

template <class T, class U>
bool same(const std::optional<T>& want, bool present, const U& have) {
  return !want || (present && *want == have);
}

}  // namespace

const char* action_name(Action a) {
  switch (a) {
    case Action::kDrop:
      return "drop";
    case Action::kDelay:
      return "delay";
    case Action::kDuplicate:
      return "duplicate";
    case Action::kReorder:
      return "reorder";
    case Action::kCorrupt:
      return "corrupt";
    case Action::kWatch:
      return "watch";
  }
  return "?";
}

Rule parse_rule(const json& j) {
  if (!j.is_object()) throw RuleError("rule: expected a JSON object, got " + type_of(j));
  Rule r;
  r.spec = j;
  r.action = parse_action(j);
  for (const auto& [key, v] : j.items()) {
    const std::string field = "rule." + key;
    if (key == "action") continue;
    if (parse_match_key(r.match, key, v, field)) continue;
    if (owner(key)) {
      parse_action_key(r, key, v, field);
    } else if (key == "count" || key == "every" || key == "probability") {
      parse_how_often(r, key, v, field);
    } else {
      fail(field, "unknown key");
    }
  }
  if (r.action == Action::kDelay && !j.contains("delay_ns")) fail("rule.delay_ns", "missing");
  if (r.action == Action::kCorrupt && !j.contains("layer"))
    fail("rule.layer", "missing (" + layer_names() + ")");
  if (r.action == Action::kCorrupt && !j.contains("offset")) fail("rule.offset", "missing");
  return r;
}

Hosts parse_hosts(const json& j) {
  if (!j.is_object()) throw RuleError("hosts: expected an object of name -> {mac, ip}");
  Hosts out;
  for (const auto& [name, v] : j.items()) {
    const std::string field = "hosts." + name;
    if (!v.is_object()) fail(field, "expected {\"mac\": ..., \"ip\": ...}");
    Host h;
    for (const auto& [key, a] : v.items()) {
      const std::string s = get_string(a, field + "." + key);
      if (key == "mac") {
        Mac m{};
        unsigned b[6];
        char tail = 0;
        if (std::sscanf(s.c_str(), "%2x:%2x:%2x:%2x:%2x:%2x%c", &b[0], &b[1], &b[2], &b[3], &b[4],
                        &b[5], &tail) != 6)
          fail(field + ".mac", "expected xx:xx:xx:xx:xx:xx, got \"" + s + "\"");
        for (int i = 0; i < 6; ++i) m[i] = static_cast<uint8_t>(b[i]);
        h.mac = m;
      } else if (key == "ip") {
        Ip ip;
        if (inet_pton(AF_INET, s.c_str(), ip.src.data()) == 1) {
          ip.version = 4;
        } else if (inet_pton(AF_INET6, s.c_str(), ip.src.data()) == 1) {
          ip.version = 6;
        } else {
          fail(field + ".ip", "expected an IPv4 or IPv6 address, got \"" + s + "\"");
        }
        h.ip = ip;
      } else {
        fail(field + "." + key, "unknown key (mac, ip)");
      }
    }
    if (!h.mac && !h.ip) fail(field, "give a mac, an ip or both");
    out[name] = h;
  }
  return out;
}

json hosts_json(const Hosts& hosts) {
  json j = json::object();
  for (const auto& [name, h] : hosts) {
    json e = json::object();
    if (h.mac) e["mac"] = mac_string(*h.mac);
    if (h.ip) e["ip"] = ip_string(*h.ip, true);
    j[name] = e;
  }
  return j;
}

bool matches(const Match& m, const Frame& f, const Hosts& h) {
  if (!proto_matches(m.proto, f) || !hosts_match(m, f, h)) return false;
  if (m.opcode && !opcode_matches(*m.opcode, f)) return false;
  if (!same(m.opcode_value, f.bth.has_value(), f.bth ? f.bth->opcode : 0)) return false;
  if (m.transport) {
    const char* t = f.bth ? bth_transport_name(f.bth->opcode) : nullptr;
    if (t == nullptr || *m.transport != t) return false;
  }
  if (!same(m.dest_qpn, f.bth.has_value(), f.bth ? f.bth->dest_qpn : 0)) return false;
  if (!same(m.psn, f.bth.has_value(), f.bth ? f.bth->psn : 0)) return false;
  if (!same(m.src_qpn, f.deth.has_value(), f.deth ? f.deth->src_qpn : 0)) return false;
  if (m.syndrome) {
    const char* s = f.aeth ? aeth_syndrome_name(f.aeth->syndrome) : nullptr;
    if (s == nullptr || *m.syndrome != s) return false;
  }
  if (!same(m.mad_attr_id, f.mad.has_value(), f.mad ? f.mad->attr_id : 0)) return false;
  if (m.cm_class && (!f.mad || f.mad->mgmt_class != kMgmtClassCm)) return false;
  if (m.tcp_flags && (!f.tcp || (f.tcp->flags & *m.tcp_flags) != *m.tcp_flags)) return false;
  if (!same(m.rdmap_opcode, f.fpdu.has_value(), f.fpdu ? f.fpdu->rdmap_opcode : 0)) return false;
  if (m.port) {
    const bool udp = f.udp && (f.udp->src_port == *m.port || f.udp->dst_port == *m.port);
    const bool tcp = f.tcp && (f.tcp->src_port == *m.port || f.tcp->dst_port == *m.port);
    if (!udp && !tcp) return false;
  }
  return true;
}

bool applicable(const Rule& r, const Frame& f) {
  if (r.action != Action::kCorrupt) return true;
  const auto span = layer_span(f, r.corrupt.layer);
  return span && r.corrupt.offset < span->len;
}

}  // namespace rdmalab::faults
