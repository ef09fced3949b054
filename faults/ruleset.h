// The live rule set of a switch: rules by id, the host names they use, the seeded generator,
// and the record of what was done: counters and an in-memory history of JSON records.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "faults/rules.h"

namespace rdmalab::faults {

struct Decision {
  uint64_t rule_id = 0;
  Action action = Action::kDrop;
  uint64_t delay_ns = 0;  // delay
  uint64_t hold_ns = 0;   // reorder
  CorruptSpec corrupt;
  uint64_t record_seq = 0;  // the history record of this decision (a release names it)
};

class RuleSet {
 public:
  explicit RuleSet(uint64_t seed, size_t history_cap = 100'000);

  uint64_t add(Rule r);  // throws RuleError for a host name not bound
  bool remove(uint64_t id);
  size_t clear();  // returns how many were removed
  void set_hosts(Hosts h);
  const Hosts& hosts() const { return hosts_; }

  // Counts the frame by type, then asks each rule in order; the first that takes the frame
  // decides, and its action is counted and recorded. nullopt: forward unchanged.
  std::optional<Decision> decide(const Frame& f, uint64_t now_ns);

  // Adds what the switch did with the last decision to its record (corrupt: the byte flipped
  // and the checks recomputed).
  void annotate_last(const std::string& key, nlohmann::json value);
  // A delayed or held frame leaving the switch (switch.h, "release" records): the rule that
  // kept it, the seq of the record that decided it, why it left now, and how long it was kept.
  void record_release(uint64_t rule_id, uint64_t of_seq, const char* reason, uint64_t held_ns,
                      uint64_t now_ns);
  // A frame too short to carry an Ethernet header: it cannot be switched.
  void count_unroutable() {
    ++frames_;
    ++malformed_;
  }

  nlohmann::json rules_json() const;
  nlohmann::json counters_json() const;
  // At most limit records with seq > since, oldest first; "last_seq" is the since for the next
  // call; "evicted" counts records dropped past the cap (oldest first).
  nlohmann::json history_json(uint64_t since, size_t limit = 10'000) const;

 private:
  struct Entry {
    Rule rule;
    uint64_t rng = 0;      // splitmix64 state, seeded from (seed, id)
    uint64_t matched = 0;  // frames whose fields matched
    uint64_t acted = 0;
  };
  bool takes(Entry& e, const Frame& f);
  void count_frame(const Frame& f);
  uint64_t record(nlohmann::json rec);  // returns the record's seq

  uint64_t seed_;
  size_t history_cap_;
  uint64_t next_id_ = 1;
  std::vector<Entry> rules_;  // in order of addition: first match wins
  Hosts hosts_;
  uint64_t next_seq_ = 1;
  uint64_t evicted_ = 0;
  std::deque<nlohmann::json> history_;
  std::map<std::string, uint64_t> actions_;
  std::map<std::string, std::map<std::string, uint64_t>> frames_by_type_;  // roce, cm, iwarp
  uint64_t frames_ = 0, malformed_ = 0, tcp_ = 0, other_ = 0;
};

}  // namespace rdmalab::faults
