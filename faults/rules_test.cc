#include "faults/rules.h"

#include <gtest/gtest.h>

#include "faults/ruleset.h"
#include "faults/test_frames.h"

namespace rdmalab::faults {
namespace {

using namespace testing;
using nlohmann::json;

Frame p(const Frame8& b) {
  return parse(b);
}

bool match(const json& rule, const Frame8& b, const Hosts& h = {}) {
  return matches(parse_rule(rule).match, parse(b), h);
}

std::string rule_error(const json& rule) {
  try {
    parse_rule(rule);
  } catch (const RuleError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(RuleParse, ErrorsNameTheField) {
  const std::pair<json, std::string> cases[] = {
      {json::array(), "rule: expected a JSON object"},
      {{{"dest_qpn", 1}}, "rule.action: missing"},
      {{{"action", "explode"}}, "rule.action: unknown action 'explode'"},
      {{{"action", 3}}, "rule.action: expected a string, got an integer"},
      {{{"action", "delay"}}, "rule.delay_ns: missing"},
      {{{"action", "delay"}, {"delay_ns", -5}}, "rule.delay_ns: expected an integer >= 0"},
      {{{"action", "delay"}, {"delay_ns", 1.5}}, "rule.delay_ns: expected an integer, got a float"},
      {{{"action", "drop"}, {"delay_ns", 5}}, "rule.delay_ns: only for action delay"},
      {{{"action", "drop"}, {"dest_qpn", "x"}}, "rule.dest_qpn: expected an integer, got a string"},
      {{{"action", "drop"}, {"dest_qpn", 1 << 24}}, "rule.dest_qpn: expected at most 16777215"},
      {{{"action", "drop"}, {"bogus", 1}}, "rule.bogus: unknown key"},
      {{{"action", "drop"}, {"cm", "HELLO"}},
       "rule.cm: unknown CM message \"HELLO\" (REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, "
       "SIDR_REP, LAP, APR)"},
      {{{"action", "drop"}, {"opcode", "SEND_SOMETIMES"}}, "rule.opcode: unknown opcode"},
      {{{"action", "drop"}, {"cm", "DREP"}, {"opcode", "SEND_ONLY"}}, "rule.opcode: conflicts"},
      {{{"action", "drop"}, {"syndrome", "MAYBE"}}, "rule.syndrome: unknown AETH syndrome"},
      {{{"action", "drop"}, {"tcp_flags", "FIN|XYZ"}}, "rule.tcp_flags: unknown TCP flag 'XYZ'"},
      {{{"action", "drop"}, {"rdmap_opcode", "WRITE"}}, "rule.rdmap_opcode: unknown RDMAP"},
      {{{"action", "drop"}, {"proto", "udp"}}, "rule.proto: expected \"roce\""},
      {{{"action", "drop"}, {"direction", "a-b"}}, "rule.direction: expected \"a->b\""},
      {{{"action", "drop"}, {"direction", "a->b"}, {"src_host", "a"}},
       "rule.src_host: given twice"},
      {{{"action", "drop"}, {"count", 0}}, "rule.count: expected at least 1"},
      {{{"action", "drop"}, {"every", 0}}, "rule.every: expected at least 1"},
      {{{"action", "drop"}, {"probability", 1.5}}, "rule.probability: expected a number in 0..1"},
      {{{"action", "drop"}, {"probability", "half"}}, "rule.probability: expected a number"},
      {{{"action", "corrupt"}, {"offset", 1}}, "rule.layer: missing"},
      {{{"action", "corrupt"}, {"layer", "bth"}}, "rule.offset: missing"},
      {{{"action", "corrupt"}, {"layer", "lrh"}, {"offset", 1}}, "rule.layer: unknown layer"},
      {{{"action", "corrupt"}, {"layer", "bth"}, {"offset", 1}, {"xor", 0}}, "rule.xor: 0 changes"},
      {{{"action", "corrupt"}, {"layer", "bth"}, {"offset", 1}, {"xor", 256}},
       "rule.xor: expected at most 255"},
  };
  for (const auto& [rule, want] : cases) {
    const std::string got = rule_error(rule);
    EXPECT_EQ(got.rfind(want, 0), 0u) << rule.dump() << "\n  got: " << got;
  }
}

// cm= takes every name of the CM attribute table (rdmalab/types.h) the switch names frames by.
TEST(RuleParse, CmTakesEveryCmAttributeName) {
  for (const CmAttr& a : kCmAttrs) {
    const Rule r = parse_rule({{"action", "drop"}, {"cm", a.name}});
    EXPECT_EQ(r.match.mad_attr_id, a.id) << a.name;
    EXPECT_STREQ(cm_attr_name(a.id), a.name);
  }
  EXPECT_EQ(parse_rule({{"action", "drop"}, {"cm", "SIDR_REP"}}).match.mad_attr_id, 0x18);
}

TEST(RuleParse, ValidRules) {
  Rule r = parse_rule({{"action", "delay"}, {"delay_ns", 5000}, {"cm", "DREP"}, {"count", 2}});
  EXPECT_EQ(r.action, Action::kDelay);
  EXPECT_EQ(r.delay_ns, 5000u);
  EXPECT_EQ(r.match.opcode, "MAD");
  EXPECT_EQ(r.match.mad_attr_id, 0x16);
  EXPECT_TRUE(r.match.cm_class);
  EXPECT_EQ(r.count, 2u);
  r = parse_rule({{"action", "corrupt"},
                  {"layer", "bth"},
                  {"offset", 4},
                  {"xor", 255},
                  {"probability", 0.25},
                  {"every", 3},
                  {"count", nullptr}});
  EXPECT_EQ(r.corrupt.layer, Layer::kBth);
  EXPECT_EQ(r.corrupt.offset, 4u);
  EXPECT_EQ(r.corrupt.xor_mask, 255);
  EXPECT_EQ(r.probability_ppm, 250'000u);
  EXPECT_EQ(r.every, 3u);
  EXPECT_FALSE(r.count);
  r = parse_rule({{"action", "reorder"}, {"tcp_flags", "FIN|ACK"}, {"direction", "a<->b"}});
  EXPECT_EQ(r.hold_ns, 100'000'000u);
  EXPECT_EQ(r.match.tcp_flags, tcp_flag::FIN | tcp_flag::ACK);
  EXPECT_TRUE(r.match.either_direction);
  EXPECT_EQ(r.spec["tcp_flags"], "FIN|ACK");
}

TEST(RuleMatch, CmDrepMatchesOnlyDrep) {
  const json drop_drep = {{"action", "drop"}, {"cm", "DREP"}};
  EXPECT_TRUE(match(drop_drep, cm_drep()));
  EXPECT_FALSE(match(drop_drep, cm_mad(0x15, 1, 2)));  // DREQ
  EXPECT_FALSE(match(drop_drep, send_only_to_0x12()));
  EXPECT_FALSE(match(drop_drep, tcp_fin_ack()));
  EXPECT_TRUE(match({{"action", "drop"}, {"mad_attr_id", 0x16}}, cm_drep()));
}

TEST(RuleMatch, OpcodesAsTheModelNamesThem) {
  EXPECT_TRUE(match({{"action", "drop"}, {"opcode", "SEND_ONLY"}}, send_only_to_0x12()));
  EXPECT_TRUE(match({{"action", "drop"}, {"opcode", "SEND_ONLY"}}, ud_send()));
  // A CM MAD is "MAD", as on the model's fabric; its raw opcode still matches as a number.
  EXPECT_FALSE(match({{"action", "drop"}, {"opcode", "SEND_ONLY"}}, cm_drep()));
  EXPECT_TRUE(match({{"action", "drop"}, {"opcode", "MAD"}}, cm_drep()));
  EXPECT_TRUE(match({{"action", "drop"}, {"opcode", 0x64}}, cm_drep()));
  EXPECT_TRUE(
      match({{"action", "drop"}, {"opcode", "ACKNOWLEDGE"}, {"syndrome", "RNR_NAK"}}, rnr_nak()));
  EXPECT_FALSE(match({{"action", "drop"}, {"syndrome", "NAK_SEQ"}}, rnr_nak()));
  EXPECT_TRUE(match({{"action", "drop"}, {"transport", "UD"}}, ud_send()));
  EXPECT_FALSE(match({{"action", "drop"}, {"transport", "RC"}}, ud_send()));
  EXPECT_TRUE(
      match({{"action", "drop"}, {"dest_qpn", 0x12}, {"psn", 0x123456}}, send_only_to_0x12()));
  EXPECT_FALSE(match({{"action", "drop"}, {"dest_qpn", 0x13}}, send_only_to_0x12()));
  EXPECT_TRUE(match({{"action", "drop"}, {"src_qpn", 0x44}}, ud_send()));
  EXPECT_FALSE(match({{"action", "drop"}, {"src_qpn", 0x44}}, send_only_to_0x12()));  // no DETH
  EXPECT_TRUE(match({{"action", "drop"}, {"opcode", "TCP_FIN"}}, tcp_fin_ack()));
  EXPECT_TRUE(match({{"action", "drop"}, {"opcode", "MPA_REQUEST"}}, mpa_request()));
  EXPECT_FALSE(match({{"action", "drop"}, {"opcode", "MPA_REPLY"}}, mpa_request()));
}

TEST(RuleMatch, ProtoTcpFlagsRdmap) {
  const json iwarp = {{"action", "drop"}, {"proto", "iwarp"}};
  EXPECT_TRUE(match(iwarp, mpa_request()));
  EXPECT_TRUE(match(iwarp, fpdu_send_frame()));
  EXPECT_FALSE(match(iwarp, tcp_syn()));
  EXPECT_TRUE(match({{"action", "drop"}, {"proto", "tcp"}}, tcp_syn()));
  EXPECT_FALSE(match({{"action", "drop"}, {"proto", "roce"}}, tcp_syn()));
  EXPECT_TRUE(match({{"action", "drop"}, {"proto", "roce"}}, cm_drep()));
  EXPECT_TRUE(match({{"action", "drop"}, {"tcp_flags", "FIN|ACK"}}, tcp_fin_ack()));
  EXPECT_TRUE(match({{"action", "drop"}, {"tcp_flags", "FIN"}}, tcp_fin_ack()));
  EXPECT_FALSE(match({{"action", "drop"}, {"tcp_flags", "FIN|ACK"}}, tcp_syn()));
  EXPECT_TRUE(match({{"action", "drop"}, {"rdmap_opcode", "SEND"}}, fpdu_send_frame()));
  EXPECT_TRUE(match({{"action", "drop"}, {"rdmap_opcode", 3}}, fpdu_send_frame()));
  EXPECT_FALSE(match({{"action", "drop"}, {"rdmap_opcode", "RDMA_WRITE"}}, fpdu_send_frame()));
  EXPECT_TRUE(match({{"action", "drop"}, {"port", 7471}}, fpdu_send_frame()));
  EXPECT_TRUE(match({{"action", "drop"}, {"port", 4791}}, cm_drep()));
  EXPECT_FALSE(match({{"action", "drop"}, {"port", 22}}, cm_drep()));
}

TEST(RuleMatch, HostsByMacOrIp) {
  const Hosts h = parse_hosts({{"a", {{"mac", "52:54:00:12:34:01"}}}, {"b", {{"ip", "10.0.0.2"}}}});
  const json a_to_b = {{"action", "drop"}, {"src_host", "a"}, {"dst_host", "b"}};
  EXPECT_TRUE(match(a_to_b, send_only_to_0x12(), h));  // A -> B
  EXPECT_FALSE(match(a_to_b, rnr_nak(), h));           // B -> A
  EXPECT_TRUE(match({{"action", "drop"}, {"direction", "a->b"}}, send_only_to_0x12(), h));
  EXPECT_FALSE(match({{"action", "drop"}, {"direction", "a->b"}}, rnr_nak(), h));
  EXPECT_TRUE(match({{"action", "drop"}, {"direction", "a<->b"}}, rnr_nak(), h));
  EXPECT_FALSE(match({{"action", "drop"}, {"src_host", "b"}}, arp_request(), h));  // no IP
  EXPECT_EQ(hosts_json(h)["b"]["ip"], "10.0.0.2");
  EXPECT_THROW(parse_hosts({{"a", {{"mac", "52:54:00"}}}}), RuleError);
  EXPECT_THROW(parse_hosts({{"a", {{"ip", "10.0.0.300"}}}}), RuleError);
  EXPECT_THROW(parse_hosts({{"a", json::object()}}), RuleError);
  EXPECT_THROW(parse_hosts({{"a", {{"gid", "x"}}}}), RuleError);
}

uint64_t add(RuleSet& rs, const json& rule) {
  return rs.add(parse_rule(rule));
}

TEST(RuleSetTest, CountActsOnTheFirstN) {
  RuleSet rs(1);
  const uint64_t id = add(rs, {{"action", "drop"}, {"cm", "DREP"}, {"count", 2}});
  const Frame drep = p(cm_drep());
  EXPECT_TRUE(rs.decide(drep, 1));
  EXPECT_FALSE(rs.decide(p(send_only_to_0x12()), 2));
  EXPECT_TRUE(rs.decide(drep, 3));
  EXPECT_FALSE(rs.decide(drep, 4));
  const json c = rs.counters_json();
  EXPECT_EQ(c["rules"][std::to_string(id)]["acted"], 2);
  EXPECT_EQ(c["rules"][std::to_string(id)]["matched"], 3);
  EXPECT_EQ(c["actions"]["drop"], 2);
  EXPECT_EQ(c["frames"]["cm"]["DREP"], 3);
  EXPECT_EQ(c["frames"]["roce"]["RC_SEND_ONLY"], 1);
  EXPECT_EQ(c["frames"]["total"], 4);
}

TEST(RuleSetTest, EveryKth) {
  RuleSet rs(1);
  add(rs, {{"action", "duplicate"}, {"opcode", "SEND_ONLY"}, {"every", 3}});
  const Frame f = p(send_only_to_0x12());
  std::string pattern;
  for (int i = 0; i < 9; ++i) pattern += rs.decide(f, 0) ? 'x' : '.';
  EXPECT_EQ(pattern, "..x..x..x");
}

std::string draws(uint64_t seed, const Frame& f, int n = 64) {
  RuleSet rs(seed);
  add(rs, {{"action", "drop"}, {"probability", 0.5}});
  std::string s;
  for (int i = 0; i < n; ++i) s += rs.decide(f, 0) ? '1' : '0';
  return s;
}

TEST(RuleSetTest, ProbabilityReplaysWithTheSeed) {
  const Frame f = p(send_only_to_0x12());
  EXPECT_EQ(draws(42, f), draws(42, f));
  EXPECT_NE(draws(42, f), draws(43, f));
  const std::string many = draws(7, f, 4000);
  const auto ones = std::count(many.begin(), many.end(), '1');
  EXPECT_GT(ones, 1800);
  EXPECT_LT(ones, 2200);
  // A rule's stream is its own: draws another rule makes do not shift this one's.
  RuleSet mixed(42), sends_only(42);
  for (RuleSet* rs : {&mixed, &sends_only}) {
    add(*rs, {{"action", "duplicate"}, {"opcode", "ACKNOWLEDGE"}, {"probability", 0.5}});
    add(*rs, {{"action", "drop"}, {"opcode", "SEND_ONLY"}, {"probability", 0.5}});
  }
  const Frame ack_frame = p(rnr_nak());
  for (int i = 0; i < 64; ++i) {
    mixed.decide(ack_frame, 0);
    EXPECT_EQ(mixed.decide(f, 0).has_value(), sends_only.decide(f, 0).has_value()) << i;
  }
  RuleSet never(1), always(1);
  add(never, {{"action", "drop"}, {"probability", 0}});
  add(always, {{"action", "drop"}, {"probability", 1}});
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(never.decide(f, 0));
    EXPECT_TRUE(always.decide(f, 0));
  }
}

TEST(RuleSetTest, FirstMatchWinsAndSpentRulesLetFramesThrough) {
  RuleSet rs(1);
  const uint64_t first = add(rs, {{"action", "drop"}, {"opcode", "SEND_ONLY"}, {"count", 1}});
  const uint64_t second = add(rs, {{"action", "delay"}, {"delay_ns", 10}});
  const Frame f = p(send_only_to_0x12());
  auto d = rs.decide(f, 0);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->rule_id, first);
  EXPECT_EQ(d->action, Action::kDrop);
  d = rs.decide(f, 0);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->rule_id, second);
  EXPECT_EQ(d->delay_ns, 10u);
}

TEST(RuleSetTest, WatchCountsAndLetsTheNextRuleDecide) {
  RuleSet rs(1);
  const uint64_t w = add(rs, {{"action", "watch"}, {"cm", "DREQ"}});
  const uint64_t d = add(rs, {{"action", "drop"}, {"opcode", "MAD"}});
  const auto dec = rs.decide(p(cm_mad(0x15, 1, 2)), 5);
  ASSERT_TRUE(dec);
  EXPECT_EQ(dec->rule_id, d);
  EXPECT_FALSE(rs.decide(p(send_only_to_0x12()), 6));
  const json c = rs.counters_json();
  EXPECT_EQ(c["rules"][std::to_string(w)]["acted"], 1);
  EXPECT_EQ(c["actions"]["watch"], 1);
  EXPECT_EQ(c["actions"]["drop"], 1);
  const json h = rs.history_json(0)["records"];
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0]["action"], "watch");
  EXPECT_EQ(h[1]["action"], "drop");
}

TEST(RuleSetTest, RemoveByIdAndClear) {
  RuleSet rs(1);
  const uint64_t a = add(rs, {{"action", "drop"}, {"cm", "DREP"}});
  const uint64_t b = add(rs, {{"action", "drop"}, {"cm", "DREQ"}});
  EXPECT_NE(a, b);
  EXPECT_TRUE(rs.remove(a));
  EXPECT_FALSE(rs.remove(a));
  EXPECT_FALSE(rs.decide(p(cm_drep()), 0));
  EXPECT_TRUE(rs.decide(p(cm_mad(0x15, 1, 2)), 0));
  EXPECT_EQ(rs.rules_json().size(), 1u);
  EXPECT_EQ(rs.rules_json()[0]["id"], b);
  EXPECT_EQ(rs.rules_json()[0]["rule"]["cm"], "DREQ");
  EXPECT_EQ(rs.clear(), 1u);
  EXPECT_TRUE(rs.rules_json().empty());
}

TEST(RuleSetTest, HostNamesMustBeBound) {
  RuleSet rs(1);
  try {
    add(rs, {{"action", "drop"}, {"src_host", "c"}});
    FAIL() << "accepted an unbound host";
  } catch (const RuleError& e) {
    EXPECT_NE(std::string(e.what()).find("rule.src_host: no host 'c'"), std::string::npos);
  }
  rs.set_hosts(parse_hosts({{"c", {{"mac", "52:54:00:12:34:03"}}}}));
  EXPECT_NO_THROW(add(rs, {{"action", "drop"}, {"src_host", "c"}}));
}

TEST(RuleSetTest, CorruptRulesTakeOnlyFramesWithTheByte) {
  RuleSet rs(1);
  add(rs, {{"action", "corrupt"}, {"layer", "deth"}, {"offset", 2}});
  EXPECT_FALSE(rs.decide(p(send_only_to_0x12()), 0));
  const auto d = rs.decide(p(ud_send()), 0);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->corrupt.layer, Layer::kDeth);
  EXPECT_EQ(d->corrupt.offset, 2u);
}

TEST(RuleSetTest, HistoryRecordsEveryActionInOrder) {
  RuleSet rs(1, /*history_cap=*/3);
  const uint64_t id = add(rs, {{"action", "drop"}, {"cm", "DREP"}});
  for (int i = 0; i < 5; ++i) rs.decide(p(cm_drep()), 100 + i);
  rs.decide(p(send_only_to_0x12()), 200);  // not acted on: not recorded
  json h = rs.history_json(0);
  ASSERT_EQ(h["records"].size(), 3u);
  EXPECT_EQ(h["evicted"], 2);
  EXPECT_EQ(h["last_seq"], 5);
  const json& r = h["records"][0];
  EXPECT_EQ(r["seq"], 3);
  EXPECT_EQ(r["t_ns"], 102);
  EXPECT_EQ(r["rule"], id);
  EXPECT_EQ(r["action"], "drop");
  EXPECT_EQ(r["frame"]["cm"], "DREP");
  EXPECT_EQ(rs.history_json(4)["records"].size(), 1u);
  EXPECT_EQ(rs.history_json(5)["records"].size(), 0u);
  EXPECT_EQ(rs.history_json(5)["last_seq"], 5);
  h = rs.history_json(0, /*limit=*/2);
  EXPECT_EQ(h["records"].size(), 2u);
  EXPECT_EQ(h["last_seq"], 4);
  rs.annotate_last("corrupted", {{"frame_offset", 3}});
  EXPECT_EQ(rs.history_json(4)["records"][0]["corrupted"]["frame_offset"], 3);
}

TEST(RuleSetTest, FramesCountedByType) {
  RuleSet rs(1);
  for (const Frame8& b : {cm_drep(), cm_mad(0x10, 1, 0), rnr_nak(), tcp_syn(), mpa_request(),
                          fpdu_send_frame(), arp_request()})
    rs.decide(p(b), 0);
  Frame8 cut = send_only_to_0x12();
  cut.resize(40);
  rs.decide(p(cut), 0);
  rs.count_unroutable();
  const json f = rs.counters_json()["frames"];
  EXPECT_EQ(f["cm"]["DREP"], 1);
  EXPECT_EQ(f["cm"]["REQ"], 1);
  EXPECT_EQ(f["roce"]["RC_ACKNOWLEDGE"], 1);
  EXPECT_EQ(f["tcp"], 1);
  EXPECT_EQ(f["iwarp"]["MPA_REQUEST"], 1);
  EXPECT_EQ(f["iwarp"]["SEND"], 1);
  EXPECT_EQ(f["other"], 1);
  EXPECT_EQ(f["malformed"], 2);
  EXPECT_EQ(f["total"], 9);
}

}  // namespace
}  // namespace rdmalab::faults
