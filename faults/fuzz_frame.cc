// libFuzzer target (make fuzz): arbitrary bytes through the parser, the frame summary, the
// checks, the rule set and the corrupter with fixed rules. Beyond "no crash, no sanitizer
// report" it aborts when a property fails: every offset the parser reports lies inside the
// input; a corruption changes only its byte and the checks it recomputes; after a corruption at
// or past the BTH the ICRC verifies, and after one past Ethernet the IPv4 checksum does.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "faults/checksum.h"
#include "faults/corrupt.h"
#include "faults/frame.h"
#include "faults/ruleset.h"

namespace {

using namespace rdmalab::faults;
using nlohmann::json;

void check(bool ok) {
  if (!ok) std::abort();
}

const std::vector<json>& rule_specs() {
  static const std::vector<json> specs = [] {
    std::vector<json> s = {
        {{"action", "drop"}, {"cm", "DREP"}},
        {{"action", "delay"}, {"delay_ns", 1000}, {"tcp_flags", "FIN"}},
        {{"action", "duplicate"}, {"opcode", "ACKNOWLEDGE"}, {"syndrome", "RNR_NAK"}, {"every", 2}},
        {{"action", "reorder"}, {"proto", "iwarp"}, {"rdmap_opcode", "SEND"}},
        {{"action", "drop"}, {"direction", "a<->b"}, {"probability", 0.3}},
    };
    const std::pair<const char*, int> corrupt[] = {
        {"eth", 0},   {"ip", 1},         {"ip", 10},         {"udp", 6},  {"tcp", 13},
        {"icrc", 0},  {"bth", 0},        {"bth", 4},         {"deth", 0}, {"aeth", 0},
        {"mad", 16},  {"payload", 0},    {"tcp_payload", 0}, {"mpa", 1},  {"ddp", 0},
        {"rdmap", 0}, {"ulp_payload", 0}};
    for (const auto& [layer, off] : corrupt)
      s.push_back({{"action", "corrupt"}, {"layer", layer}, {"offset", off}, {"xor", 0x5A}});
    return s;
  }();
  return specs;
}

const Hosts& hosts() {
  static const Hosts h = parse_hosts({{"a", {{"mac", "52:54:00:12:34:01"}, {"ip", "10.0.0.1"}}},
                                      {"b", {{"ip", "fe80::5054:ff:fe12:3402"}}}});
  return h;
}

const std::vector<Rule>& corrupt_rules() {
  static const std::vector<Rule> rules = [] {
    std::vector<Rule> r;
    for (const json& s : rule_specs())
      if (Rule rule = parse_rule(s); rule.action == Action::kCorrupt) r.push_back(std::move(rule));
    return r;
  }();
  return rules;
}

RuleSet& ruleset() {
  static RuleSet rs = [] {
    RuleSet r(1, /*history_cap=*/256);
    r.set_hosts(hosts());
    for (const json& s : rule_specs()) r.add(parse_rule(s));
    return r;
  }();
  return rs;
}

void check_spans(const Frame& f, size_t size) {
  check(f.stop_offset <= size && f.len == size);
  for (int l = 0; l <= static_cast<int>(Layer::kUlpPayload); ++l)
    if (const auto s = layer_span(f, static_cast<Layer>(l))) check(s->off + s->len <= size);
}

// The bytes a corruption may change: its own, and the fields of the checks it recomputed.
bool only_expected_changes(const std::vector<uint8_t>& before, const std::vector<uint8_t>& after,
                           const Frame& f, const CorruptResult& r) {
  std::vector<bool> may(before.size(), false);
  may[r.frame_offset] = true;
  const auto allow = [&](size_t off, size_t n) {
    for (size_t i = off; i < off + n && i < may.size(); ++i) may[i] = true;
  };
  for (const std::string& c : r.recomputed) {
    if (c == "ipv4") allow(f.ip->off + 10, 2);
    if (c == "udp") allow(f.udp->off + 6, 2);
    if (c == "tcp") allow(f.tcp->off + 16, 2);
    if (c == "icrc") allow(*f.icrc_off, 4);
    if (c == "mpa_crc") allow(f.fpdu->off + f.fpdu->len - 4, 4);
  }
  for (size_t i = 0; i < before.size(); ++i)
    if (before[i] != after[i] && !may[i]) return false;
  return true;
}

void corrupt_and_check(const std::vector<uint8_t>& in, const Frame& f, const Rule& r) {
  std::vector<uint8_t> out = in;
  const CorruptResult res = corrupt(out, f, r.corrupt);
  check(res.applied);
  check(only_expected_changes(in, out, f, res));
  const Frame g = parse(out);
  check_spans(g, out.size());
  const Layer l = r.corrupt.layer;
  const bool past_bth =
      l != Layer::kEth && l != Layer::kIp && l != Layer::kUdp && l != Layer::kIcrc;
  if (f.bth && past_bth && g.bth && g.icrc_off) check(icrc_ok(out, g));
  const bool hit_ip_checksum =
      f.ip && res.frame_offset >= f.ip->off + 10 && res.frame_offset < f.ip->off + 12;
  if (f.ip && f.ip->version == 4 && l != Layer::kEth && !hit_ip_checksum && g.ip &&
      g.ip->version == 4 && g.ip->header_len == f.ip->header_len)
    check(ipv4_checksum_ok(out, g));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> in(data, data + size);
  const Frame f = parse(in);
  check_spans(f, size);
  (void)summary(f).dump();
  (void)icrc_ok(in, f);
  (void)ipv4_checksum_ok(in, f);
  (void)mpa_crc(in, f);
  if (f.udp) (void)udp_checksum_ok(in, f);
  if (f.tcp) (void)tcp_checksum_ok(in, f);
  (void)ruleset().decide(f, 0);
  for (const Rule& r : corrupt_rules())
    if (matches(r.match, f, hosts()) && applicable(r, f)) corrupt_and_check(in, f, r);
  return 0;
}
