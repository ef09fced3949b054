// The model's packets as the frames they stand for (wire_rules.h): for each of the switch's match
// keys, a rule takes a model packet exactly when the switch's parser and matcher take the real
// frame of the same kind (faults/test_frames.h: frames built byte by byte as rxe and siw send
// them).
#include "model/wire_rules.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "faults/rules.h"
#include "faults/test_frames.h"

namespace rdmalab::model {
namespace {

namespace ft = faults::testing;
using nlohmann::json;

struct Case {
  const char* what;
  Packet pkt;
  bool iwarp;
  ft::Frame8 real;
};

Packet packet(const char* src, const char* dst, const char* opcode, uint32_t dest_qpn, uint32_t psn,
              uint32_t length = 0) {
  Packet p;
  p.src_host = src;
  p.dst_host = dst;
  p.opcode = opcode;
  p.dest_qpn = dest_qpn;
  p.psn = psn;
  p.length = length;
  return p;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"RC SEND", packet("a", "b", "SEND_ONLY", 0x12, 0x123456, 16), false,
                 ft::send_only_to_0x12()});
  Packet drep = packet("a", "b", "MAD", 1, 7, 256);
  drep.src_qpn = 1;
  drep.mad_attr_id = 0x16;
  out.push_back({"CM DREP", drep, false, ft::cm_drep()});
  Packet ack = packet("b", "a", "ACKNOWLEDGE", 0x12, 0x42);
  ack.syndrome = "ACK";
  out.push_back({"ACK", ack, false, ft::ack(0x1F, 5)});
  Packet rnr = ack;
  rnr.syndrome = "RNR_NAK";
  out.push_back({"RNR NAK", rnr, false, ft::rnr_nak()});
  Packet ud = packet("a", "b", "SEND_ONLY", 0x33, 9, 7);
  ud.qp_type = QpType::UD;
  ud.src_qpn = 0x44;
  out.push_back({"UD SEND", ud, false, ft::ud_send()});
  out.push_back({"TCP FIN", packet("a", "b", "TCP_FIN", 0, 0), true, ft::tcp_fin_ack()});
  out.push_back({"TCP SYN", packet("a", "b", "TCP_SYN", 0, 0), true, ft::tcp_syn()});
  out.push_back({"MPA request", packet("a", "b", "MPA_REQUEST", 0, 0, 8), true, ft::mpa_request()});
  out.push_back(
      {"FPDU SEND", packet("a", "b", "SEND_ONLY", 0, 0, 64), true, ft::fpdu_send_frame()});
  return out;
}

// One rule per key and value the switch takes (faults/rules.h), port= only as RoCE's 4791.
std::vector<json> rules() {
  std::vector<json> out = {json::object()};
  const auto key = [&](const char* k, std::vector<json> values) {
    for (json& v : values) out.push_back({{k, std::move(v)}});
  };
  key("proto", {"roce", "tcp", "iwarp", "any"});
  key("direction", {"a->b", "b->a", "a<->b"});
  key("src_host", {"a", "b"});
  key("dst_host", {"a", "b"});
  key("opcode", {"SEND_ONLY", "MAD", "ACKNOWLEDGE", "TCP_FIN", "TCP_SYN", "TCP_ACK", "TCP_RST",
                 "MPA_REQUEST", "MPA_REPLY", 0x04, 0x64, 0x11});
  key("transport", {"RC", "UD", "XRC"});
  key("dest_qpn", {0x12, 1, 0x33});
  key("src_qpn", {1, 0x44});
  key("psn", {7, 0x42, 0x123456});
  key("syndrome", {"ACK", "RNR_NAK", "NAK_SEQ"});
  key("cm", {"DREP", "REQ"});
  key("mad_attr_id", {0x16, 0x10});
  key("tcp_flags", {"FIN", "SYN", "ACK", "FIN|ACK", "RST"});
  key("rdmap_opcode", {"SEND", "RDMA_WRITE", "TERMINATE", 3});
  key("port", {4791});
  return out;
}

faults::Hosts real_hosts() {
  faults::Host a, b;
  a.mac = ft::kMacA;
  b.mac = ft::kMacB;
  return {{"a", a}, {"b", b}};
}

TEST(WireRules, EachKeyTakesAModelPacketAsTheSwitchTakesTheRealFrame) {
  const WireHost a = wire_host(0, false), b = wire_host(1, false);
  const WireHost ia = wire_host(0, true), ib = wire_host(1, true);
  const faults::Hosts model_hosts = {{"a", a.addr}, {"b", b.addr}};
  const faults::Hosts switch_hosts = real_hosts();
  size_t taken = 0, pairs = 0;  // (frame, rule) pairs, and those the rule takes on both
  for (const Case& c : cases()) {
    const faults::Frame real = faults::parse(c.real);
    ASSERT_EQ(real.stop, faults::Stop::kComplete) << c.what << ": " << real.why;
    const bool from_a = c.pkt.src_host == "a";
    const WireHost* src = c.iwarp ? (from_a ? &ia : &ib) : (from_a ? &a : &b);
    const WireHost* dst = c.iwarp ? (from_a ? &ib : &ia) : (from_a ? &b : &a);
    const faults::Frame model = wire_frame(c.pkt, src, dst);
    for (json spec : rules()) {
      spec["action"] = "drop";
      const faults::Rule r = faults::parse_rule(spec);
      const bool on_model = faults::matches(r.match, model, model_hosts);
      EXPECT_EQ(on_model, faults::matches(r.match, real, switch_hosts))
          << c.what << " under " << spec.dump();
      taken += on_model;
      ++pairs;
    }
  }
  // Most keys split the frames: neither "takes all" nor "takes none" could pass.
  EXPECT_GT(taken, pairs / 5) << taken << " of " << pairs;
  EXPECT_LT(taken, pairs / 2) << taken << " of " << pairs;
}

TEST(WireRules, AResponderErrorOnIwarpIsATerminateAndAnAckATcpAck) {
  const WireHost a = wire_host(0, true), b = wire_host(1, true);
  Packet p = packet("b", "a", "ACKNOWLEDGE", 0, 3);
  p.syndrome = "NAK_REM_ACCESS";
  faults::Frame f = wire_frame(p, &b, &a);
  ASSERT_TRUE(f.fpdu.has_value());
  EXPECT_EQ(f.fpdu->rdmap_opcode, 7);
  EXPECT_FALSE(f.bth.has_value());
  p.syndrome = "ACK";
  f = wire_frame(p, &b, &a);
  EXPECT_FALSE(f.fpdu.has_value());
  ASSERT_TRUE(f.tcp.has_value());
  EXPECT_EQ(f.tcp->flags, faults::tcp_flag::ACK);
  EXPECT_EQ(f.tcp->payload_len, 0u);
}

TEST(WireRules, XrcAndReadResponsesCarryWhatTheirHeadersSay) {
  const WireHost a = wire_host(0, false), b = wire_host(1, false);
  Packet p = packet("a", "b", "SEND_ONLY", 9, 1);
  p.qp_type = QpType::XRC_SEND;
  faults::Frame f = wire_frame(p, &a, &b);
  ASSERT_TRUE(f.bth.has_value());
  EXPECT_STREQ(faults::bth_transport_name(f.bth->opcode), "XRC");
  EXPECT_STREQ(faults::bth_opcode_name(f.bth->opcode), "SEND_ONLY");
  p = packet("b", "a", "RDMA_READ_RESPONSE_ONLY", 9, 1);
  f = wire_frame(p, &b, &a);
  ASSERT_TRUE(f.aeth.has_value());  // IBTA 9.3.3: a read response ONLY carries an AETH
  EXPECT_STREQ(faults::aeth_syndrome_name(f.aeth->syndrome), "ACK");
}

TEST(WireRules, BadRulesAreRefusedNamingTheKey) {
  WireRules w(1);
  w.add_host("a", false);
  w.add_host("b", false);
  const auto refused = [&](const json& spec, const std::string& want) {
    try {
      w.add(spec);
      ADD_FAILURE() << spec.dump() << " was taken";
    } catch (const faults::RuleError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused({{"action", "drop"}, {"opcode", "SEND_ONYL"}}, "rule.opcode: unknown opcode");
  refused({{"action", "drop"}, {"probability", 50}}, "rule.probability: expected a number in 0..1");
  refused({{"action", "drop"}, {"src_host", "c"}}, "no host 'c'");
  refused({{"action", "corrupt"}, {"layer", "bth"}, {"offset", 0}}, "rule.action: corrupt");
  EXPECT_TRUE(w.empty());
  EXPECT_EQ(w.add({{"action", "drop"}, {"transport", "RC"}, {"port", 4791}}), 1u);
  w.add_host("c", true);
  refused({{"action", "drop"}, {"port", 7471}}, "rule.port: the model's iWARP packets");
}

TEST(WireRules, WatchCountsAndPassesTheFirstTakerDecides) {
  WireRules w(1);
  w.add_host("a", false);
  w.add_host("b", false);
  const uint64_t watch = w.add({{"action", "watch"}, {"opcode", "SEND_ONLY"}});
  const uint64_t drop = w.add({{"action", "drop"}, {"direction", "a->b"}, {"every", 2}});
  const Packet p = packet("a", "b", "SEND_ONLY", 0x12, 0);
  std::vector<bool> dropped;
  for (int i = 0; i < 4; ++i) dropped.push_back(w.decide(p, 0).has_value());
  EXPECT_EQ(dropped, (std::vector<bool>{false, true, false, true}));
  EXPECT_FALSE(w.decide(packet("b", "a", "SEND_ONLY", 0x12, 0), 0).has_value());
  const json rules = w.rules_json();
  EXPECT_EQ(rules[0]["id"], watch);
  EXPECT_EQ(rules[0]["acted"], 5);
  EXPECT_EQ(rules[1]["id"], drop);
  EXPECT_EQ(rules[1]["acted"], 2);
  EXPECT_TRUE(w.remove(drop));
  EXPECT_FALSE(w.remove(drop));
  EXPECT_EQ(w.clear(), 1u);
  EXPECT_TRUE(w.empty());
}

}  // namespace
}  // namespace rdmalab::model
