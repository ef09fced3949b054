// The model fabric: carries packets between hosts with latency, jitter and loss, and applies the
// fault switch's rules (wire_rules.h) to drop, delay, duplicate or reorder each one. It knows
// nothing of transports: a sender gives the header the rules see and what to do on arrival
// (TigerBeetle's packet simulator).
// Order between a pair of hosts is kept (IB and RoCE deliver in order); only an explicit DELAY
// or REORDER verdict can reorder.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "model/env.h"
#include "model/wire_rules.h"
#include "rdmalab/model.h"

namespace rdmalab::model {

class Fabric {
 public:
  using Arrival = std::function<void(const Packet&)>;
  // Why a host passes no packets (set_port_state, device_fatal, reboot): nullptr when it does.
  using LinkUp = std::function<const char*(const std::string& host)>;

  Fabric(Env& env, FabricOptions opts) : env_(env), opts_(opts), rules_(env.seed) {}

  void set_options(const FabricOptions& opts) { opts_ = opts; }
  const FabricOptions& options() const { return opts_; }
  // The wire-fault rules and the hosts they name (bound by ModelLabImpl).
  WireRules& rules() { return rules_; }
  const WireRules& rules() const { return rules_; }
  void set_link_up(LinkUp fn) { link_up_ = std::move(fn); }

  // Sends pkt (its id is assigned here); on_arrival runs at the receiver at arrival time,
  // twice for a duplicated packet, never for a lost one.
  void send(Packet pkt, const Arrival& on_arrival);

  uint64_t packets_sent() const { return next_packet_id_ - 1; }

  static constexpr const char* kPortDown = "port down";
  static constexpr const char* kHostDown = "host down";

 private:
  // The flow a REORDER waits on, as the switch's flow_key: one QP's packets between two hosts
  // (the iWARP CM's TCP packets carry dest_qpn 0: one flow per host pair).
  using Flow = std::tuple<std::string, std::string, uint32_t>;
  struct Held {
    Packet pkt;
    Arrival on_arrival;
    SimRuntime::TimerId deadline = 0;
  };

  static const char* drop_fault(const char* why);
  static Flow flow_of(const Packet& p) { return {p.src_host, p.dst_host, p.dest_qpn}; }
  void lose(const Packet& pkt, const std::string& why, const std::string& fault_name);
  void deliver_at(TimeNs t, const Packet& pkt, const Arrival& on_arrival);
  bool apply(const faults::Decision& d, const Packet& pkt, const Arrival& on_arrival,
             TimeNs arrive);
  void hold_packet(const Packet& pkt, const Arrival& on_arrival, TimeNs deadline);
  void on_deadline(const Flow& flow, uint64_t id);
  // pkt passed at arrival time t: the packets of its flow held before it arrive right after it.
  void release(const Packet& pkt, TimeNs t);
  TimeNs base_latency();

  Env& env_;
  FabricOptions opts_;
  WireRules rules_;
  LinkUp link_up_;
  uint64_t next_packet_id_ = 1;
  std::map<std::pair<std::string, std::string>, TimeNs> last_arrival_;  // per (src, dst)
  std::map<Flow, std::vector<Held>> held_;                              // REORDER, sent order
};

nlohmann::json packet_json(const Packet& p);

}  // namespace rdmalab::model
