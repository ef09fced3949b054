#include "faults/ruleset.h"

#include <algorithm>
#include <cstdio>

namespace rdmalab::faults {
namespace {

using nlohmann::json;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string hex_key(unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", v);
  return buf;
}

std::string bound_names(const Hosts& hosts) {
  std::string s;
  for (const auto& [name, h] : hosts) s += (s.empty() ? "" : ", ") + name;
  return s.empty() ? "none" : s;
}

}  // namespace

RuleSet::RuleSet(uint64_t seed, size_t history_cap) : seed_(seed), history_cap_(history_cap) {}

uint64_t RuleSet::add(Rule r) {
  for (const auto* name : {&r.match.src_host, &r.match.dst_host}) {
    if (*name && !hosts_.count(**name))
      throw RuleError(std::string(name == &r.match.src_host ? "rule.src_host" : "rule.dst_host") +
                      ": no host '" + **name +
                      "' (bind names with {\"op\":\"hosts\"}; bound: " + bound_names(hosts_) + ")");
  }
  r.id = next_id_++;
  // One stream per rule: adding or removing another rule does not change this one's draws.
  uint64_t mix = seed_ ^ (r.id * 0xD1B54A32D192ED03ull);
  Entry e{std::move(r), splitmix64(mix)};
  rules_.push_back(std::move(e));
  return rules_.back().rule.id;
}

bool RuleSet::remove(uint64_t id) {
  const auto it =
      std::find_if(rules_.begin(), rules_.end(), [&](const Entry& e) { return e.rule.id == id; });
  if (it == rules_.end()) return false;
  rules_.erase(it);
  return true;
}

size_t RuleSet::clear() {
  const size_t n = rules_.size();
  rules_.clear();
  return n;
}

void RuleSet::set_hosts(Hosts h) {
  hosts_ = std::move(h);
}

bool RuleSet::takes(Entry& e, const Frame& f) {
  const Rule& r = e.rule;
  if (!matches(r.match, f, hosts_) || !applicable(r, f)) return false;
  ++e.matched;
  if (r.count && e.acted >= *r.count) return false;
  if (e.matched % r.every != 0) return false;
  if (r.probability_ppm < 1'000'000 && splitmix64(e.rng) % 1'000'000 >= r.probability_ppm)
    return false;
  ++e.acted;
  return true;
}

std::optional<Decision> RuleSet::decide(const Frame& f, uint64_t now_ns) {
  count_frame(f);
  for (Entry& e : rules_) {
    if (!takes(e, f)) continue;
    const Rule& r = e.rule;
    Decision d{r.id, r.action, r.delay_ns, r.hold_ns, r.corrupt, 0};
    ++actions_[action_name(r.action)];
    json rec = {
        {"t_ns", now_ns}, {"rule", r.id}, {"action", action_name(r.action)}, {"frame", summary(f)}};
    switch (r.action) {
      case Action::kDelay:
        rec["delay_ns"] = r.delay_ns;
        break;
      case Action::kReorder:
        rec["hold_ns"] = r.hold_ns;
        break;
      case Action::kCorrupt:
        rec["layer"] = layer_name(r.corrupt.layer);
        rec["offset"] = r.corrupt.offset;
        rec["xor"] = r.corrupt.xor_mask;
        break;
      case Action::kDrop:
      case Action::kDuplicate:
      case Action::kWatch:
        break;
    }
    d.record_seq = record(std::move(rec));
    if (r.action == Action::kWatch) continue;  // seen, not decided: the next rules still apply
    return d;
  }
  return std::nullopt;
}

void RuleSet::record_release(uint64_t rule_id, uint64_t of_seq, const char* reason,
                             uint64_t held_ns, uint64_t now_ns) {
  record({{"t_ns", now_ns},
          {"rule", rule_id},
          {"action", "release"},
          {"of_seq", of_seq},
          {"reason", reason},
          {"held_ns", held_ns}});
}

void RuleSet::annotate_last(const std::string& key, json value) {
  if (!history_.empty()) history_.back()[key] = std::move(value);
}

void RuleSet::count_frame(const Frame& f) {
  ++frames_;
  if (f.stop == Stop::kTruncated || f.stop == Stop::kBadHeader) {
    ++malformed_;
  } else if (f.mad && f.mad->mgmt_class == kMgmtClassCm) {
    const char* n = cm_attr_name(f.mad->attr_id);
    ++frames_by_type_["cm"][n != nullptr ? n : hex_key(f.mad->attr_id)];
  } else if (f.bth) {
    const char* t = bth_transport_name(f.bth->opcode);
    const char* op = bth_opcode_name(f.bth->opcode);
    ++frames_by_type_["roce"][op != nullptr ? std::string(t) + "_" + op : hex_key(f.bth->opcode)];
  } else if (f.mpa) {
    ++frames_by_type_["iwarp"][f.mpa->request ? "MPA_REQUEST" : "MPA_REPLY"];
  } else if (f.fpdu) {
    const char* op = rdmap_opcode_name(f.fpdu->rdmap_opcode);
    ++frames_by_type_["iwarp"][op != nullptr ? op : hex_key(f.fpdu->rdmap_opcode)];
  } else if (f.tcp) {
    ++tcp_;
  } else {
    ++other_;
  }
}

uint64_t RuleSet::record(json rec) {
  const uint64_t seq = next_seq_++;
  rec["seq"] = seq;
  history_.push_back(std::move(rec));
  if (history_.size() > history_cap_) {
    history_.pop_front();
    ++evicted_;
  }
  return seq;
}

json RuleSet::rules_json() const {
  json out = json::array();
  for (const Entry& e : rules_)
    out.push_back(
        {{"id", e.rule.id}, {"rule", e.rule.spec}, {"matched", e.matched}, {"acted", e.acted}});
  return out;
}

json RuleSet::counters_json() const {
  json frames = {{"total", frames_}, {"malformed", malformed_}, {"tcp", tcp_}, {"other", other_}};
  for (const char* kind : {"roce", "cm", "iwarp"}) {
    const auto it = frames_by_type_.find(kind);
    frames[kind] = it == frames_by_type_.end() ? json::object() : json(it->second);
  }
  json actions = json::object();
  for (Action a : kActions) {
    const auto it = actions_.find(action_name(a));
    actions[action_name(a)] = it == actions_.end() ? 0 : it->second;
  }
  json rules = json::object();
  for (const Entry& e : rules_)
    rules[std::to_string(e.rule.id)] = {{"matched", e.matched}, {"acted", e.acted}};
  return {{"frames", frames}, {"actions", actions}, {"rules", rules}};
}

json RuleSet::history_json(uint64_t since, size_t limit) const {
  json records = json::array();
  uint64_t last = since;
  if (!history_.empty()) {
    const uint64_t first = history_.front().at("seq").get<uint64_t>();
    size_t i = since >= first ? static_cast<size_t>(since - first + 1) : 0;
    for (; i < history_.size() && records.size() < limit; ++i) {
      records.push_back(history_[i]);
      last = history_[i].at("seq").get<uint64_t>();
    }
  }
  return {{"records", records}, {"last_seq", last}, {"evicted", evicted_}};
}

}  // namespace rdmalab::faults
