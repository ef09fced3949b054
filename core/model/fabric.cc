#include "model/fabric.h"

#include <algorithm>

namespace rdmalab::model {

nlohmann::json packet_json(const Packet& p) {
  nlohmann::json j = {{"packet", p.id},     {"src", p.src_host},      {"dst", p.dst_host},
                      {"opcode", p.opcode}, {"dest_qpn", p.dest_qpn}, {"src_qpn", p.src_qpn},
                      {"psn", p.psn},       {"length", p.length}};
  if (!p.syndrome.empty()) j["syndrome"] = p.syndrome;
  if (p.mad_attr_id != 0) j["mad_attr_id"] = p.mad_attr_id;
  return j;
}

// A rebooting host's packets count as "host_down_drop", a dead port's as "port_down_drop".
const char* Fabric::drop_fault(const char* why) {
  return std::string_view(why) == kHostDown ? "host_down_drop" : "port_down_drop";
}

void Fabric::lose(const Packet& pkt, const std::string& why, const std::string& fault_name) {
  nlohmann::json data = packet_json(pkt);
  data["reason"] = why;
  env_.fault(pkt.src_host, "fabric", fault_name, std::move(data));
}

TimeNs Fabric::base_latency() {
  TimeNs jitter = 0;
  if (opts_.jitter_ns > 0) {
    jitter =
        static_cast<TimeNs>(env_.runtime.rng().uniform(static_cast<uint64_t>(opts_.jitter_ns) + 1));
  }
  return std::max<TimeNs>(0, opts_.latency_ns) + jitter;
}

void Fabric::send(Packet pkt, const Arrival& on_arrival) {
  pkt.id = next_packet_id_++;
  if (link_up_) {
    for (const std::string* h : {&pkt.src_host, &pkt.dst_host}) {
      if (const char* why = link_up_(*h)) return lose(pkt, why, drop_fault(why));
    }
  }
  const TimeNs now = env_.runtime.now_ns();
  const std::optional<faults::Decision> d = rules_.decide(pkt, now);
  if (!d && env_.runtime.rng().chance_ppm(opts_.loss_ppm)) {
    lose(pkt, "loss_ppm", "drop");
    return;
  }
  const auto pair = std::make_pair(pkt.src_host, pkt.dst_host);
  // In-order arrival per pair: jitter never overtakes an earlier packet.
  TimeNs arrive = std::max(now + base_latency(), last_arrival_[pair]);
  if (d) {
    if (apply(*d, pkt, on_arrival, arrive)) return;
  }
  last_arrival_[pair] = arrive;
  deliver_at(arrive, pkt, on_arrival);
  release(pkt, arrive);
}

// What rule d decided for pkt, due at arrive; false: deliver it as usual (never: corrupt is
// refused when it is added, a watch rule never decides).
bool Fabric::apply(const faults::Decision& d, const Packet& pkt, const Arrival& on_arrival,
                   TimeNs arrive) {
  nlohmann::json data = packet_json(pkt);
  data["rule"] = d.rule_id;
  switch (d.action) {
    case faults::Action::kDrop:
      data["reason"] = "rule";
      env_.fault(pkt.src_host, "fabric", "drop", std::move(data));
      return true;
    case faults::Action::kDelay: {
      const auto delay = static_cast<TimeNs>(d.delay_ns);
      data["delay_ns"] = delay;
      env_.fault(pkt.src_host, "fabric", "delay", std::move(data));
      const TimeNs t = arrive + delay;
      deliver_at(t, pkt, on_arrival);
      // It passes when it arrives (the switch forwards it then): what its flow held before it
      // follows it.
      if (held_.count(flow_of(pkt)) != 0)
        env_.runtime.schedule_at(t, [this, pkt, t] { release(pkt, t); });
      return true;  // a delayed packet may be overtaken: that is the fault
    }
    case faults::Action::kReorder: {
      const auto hold = static_cast<TimeNs>(d.hold_ns);
      data["hold_ns"] = hold;
      env_.fault(pkt.src_host, "fabric", "reorder", std::move(data));
      hold_packet(pkt, on_arrival, arrive + hold);
      return true;  // not a passing packet: it releases nothing
    }
    case faults::Action::kDuplicate: {
      env_.fault(pkt.src_host, "fabric", "duplicate", std::move(data));
      last_arrival_[std::make_pair(pkt.src_host, pkt.dst_host)] = arrive;
      deliver_at(arrive, pkt, on_arrival);
      deliver_at(arrive, pkt, on_arrival);
      release(pkt, arrive);
      return true;
    }
    case faults::Action::kCorrupt:
    case faults::Action::kWatch:
      break;
  }
  return false;
}

// A held packet arrives at its deadline unless a later packet of its flow passes first.
void Fabric::hold_packet(const Packet& pkt, const Arrival& on_arrival, TimeNs deadline) {
  const Flow flow = flow_of(pkt);
  Held h{pkt, on_arrival, 0};
  h.deadline =
      env_.runtime.schedule_at(deadline, [this, flow, id = pkt.id] { on_deadline(flow, id); });
  held_[flow].push_back(std::move(h));
}

void Fabric::on_deadline(const Flow& flow, uint64_t id) {
  auto it = held_.find(flow);
  if (it == held_.end()) return;
  auto& list = it->second;
  auto h = std::find_if(list.begin(), list.end(), [id](const Held& x) { return x.pkt.id == id; });
  if (h == list.end()) return;
  Held mine = std::move(*h);
  list.erase(h);
  if (list.empty()) held_.erase(it);
  nlohmann::json data = packet_json(mine.pkt);
  data["released_by"] = "deadline";
  env_.record(mine.pkt.src_host, "fabric", "reorder_release", std::move(data));
  const TimeNs now = env_.runtime.now_ns();
  deliver_at(now, mine.pkt, mine.on_arrival);
  release(mine.pkt, now);  // as the switch: a frame sent at its deadline releases older ones
}

void Fabric::release(const Packet& pkt, TimeNs t) {
  auto it = held_.find(flow_of(pkt));
  if (it == held_.end()) return;
  std::vector<Held> keep;
  for (Held& h : it->second) {
    if (h.pkt.id > pkt.id) {  // held after pkt was sent: waits for a later one
      keep.push_back(std::move(h));
      continue;
    }
    env_.runtime.cancel(h.deadline);
    nlohmann::json data = packet_json(h.pkt);
    data["released_by"] = "packet";
    data["after"] = pkt.id;
    env_.record(h.pkt.src_host, "fabric", "reorder_release", std::move(data));
    deliver_at(t, h.pkt, h.on_arrival);  // same time, scheduled after pkt's arrival: FIFO
  }
  if (keep.empty()) {
    held_.erase(it);
  } else {
    it->second = std::move(keep);
  }
}

void Fabric::deliver_at(TimeNs t, const Packet& pkt, const Arrival& on_arrival) {
  env_.runtime.schedule_at(t, [this, pkt, on_arrival] {
    if (const char* why = link_up_ ? link_up_(pkt.dst_host) : nullptr) {
      lose(pkt, std::string(why) + " at arrival", drop_fault(why));
      return;
    }
    on_arrival(pkt);
  });
}

}  // namespace rdmalab::model
