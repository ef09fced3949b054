// The model fabric: carries packets between hosts with latency, jitter and loss, and lets the
// wire-fault hook drop, delay or duplicate each one. It knows nothing of transports: a sender
// gives the header the hook sees and what to do on arrival (TigerBeetle's packet simulator).
// Order between a pair of hosts is kept (IB and RoCE deliver in order); only an explicit DELAY
// verdict can reorder.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "model/env.h"
#include "rdmalab/model.h"

namespace rdmalab::model {

class Fabric {
 public:
  using Arrival = std::function<void(const Packet&)>;
  // Why a host passes no packets (set_port_state, device_fatal, reboot): nullptr when it does.
  using LinkUp = std::function<const char*(const std::string& host)>;

  Fabric(Env& env, FabricOptions opts) : env_(env), opts_(opts) {}

  void set_options(const FabricOptions& opts) { opts_ = opts; }
  const FabricOptions& options() const { return opts_; }
  void set_hook(PacketHook hook) { hook_ = std::move(hook); }
  void set_link_up(LinkUp fn) { link_up_ = std::move(fn); }

  // Sends pkt (its id is assigned here); on_arrival runs at the receiver at arrival time,
  // twice for a duplicated packet, never for a lost one.
  void send(Packet pkt, const Arrival& on_arrival);

  uint64_t packets_sent() const { return next_packet_id_ - 1; }

  static constexpr const char* kPortDown = "port down";
  static constexpr const char* kHostDown = "host down";

 private:
  static const char* drop_fault(const char* why);
  void lose(const Packet& pkt, const std::string& why, const std::string& fault_name);
  void deliver_at(TimeNs t, const Packet& pkt, const Arrival& on_arrival);
  TimeNs base_latency();

  Env& env_;
  FabricOptions opts_;
  PacketHook hook_;
  LinkUp link_up_;
  uint64_t next_packet_id_ = 1;
  std::map<std::pair<std::string, std::string>, TimeNs> last_arrival_;  // per (src, dst)
};

nlohmann::json packet_json(const Packet& p);

}  // namespace rdmalab::model
