// Test helpers for the model's CM tests: one rdma_cm endpoint per host (process, channel, id,
// PD and CQ), reading events with exact virtual times, and the usual connect sequence.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>

#include "model/test_util.h"
#include "rdmalab/cm.h"
#include "rdmalab/kernel_timer.h"

namespace rdmalab::model::testing {

inline constexpr uint16_t kPort = 7471;
inline constexpr TimeNs kLatency = 2 * kNsPerUs;  // FabricOptions default
inline constexpr int kHz = 250;  // every personality's kernel (personality.cc)

// When a kernel timer of `ms` armed at `armed_ns` runs (the timer wheel rounds it up).
inline TimeNs fires(TimeNs armed_ns, int64_t ms) {
  return armed_ns + kernel_timer_delay_ns(armed_ns, static_cast<uint64_t>(ms), kHz);
}
// The n'th run of a timer re-armed each time it runs (mad.c retries).
inline TimeNs fires_n(TimeNs armed_ns, int64_t ms, int n) {
  for (int i = 0; i < n; ++i) armed_ns = fires(armed_ns, ms);
  return armed_ns;
}

struct CmEnd {
  ModelLab* lab = nullptr;
  std::shared_ptr<Process> proc;
  std::shared_ptr<CmEventChannel> ch;
  std::shared_ptr<CmId> id;  // the connected id (active id, or the passive id once accepted)
  std::shared_ptr<CmId> listener;
  std::shared_ptr<Pd> pd;
  std::shared_ptr<Cq> cq;

  static CmEnd on(ModelLab& lab, const std::string& host, const std::string& name = "p") {
    CmEnd e;
    e.lab = &lab;
    e.proc = lab.host(host)->create_process(name + "@" + host);
    e.ch = e.proc->create_event_channel();
    return e;
  }

  // The next event within `within` (acked unless told otherwise); fails the test if none.
  CmEvent next(TimeNs within = kNsPerSec, bool ack = true) {
    auto ev = ch->get_event(lab->runtime().now_ns() + within);
    EXPECT_TRUE(ev.has_value()) << "no CM event within " << within << " ns";
    if (!ev) {
      CmEvent none;
      none.event = CmEventType::DEVICE_REMOVAL;  // never sent by the model: fails any check
      none.status = -1;
      return none;
    }
    if (ack) ch->ack_event(*ev);
    return *ev;
  }

  // The next event must be `type` with `status`, read at virtual time `at_ns`.
  CmEvent expect(CmEventType type, int status, TimeNs at_ns, TimeNs within = 200 * kNsPerSec) {
    CmEvent ev = next(within);
    EXPECT_EQ(to_string(ev.event), to_string(type));
    EXPECT_EQ(ev.status, status) << to_string(ev.event);
    EXPECT_EQ(lab->runtime().now_ns(), at_ns) << to_string(ev.event);
    return ev;
  }

  bool quiet(TimeNs within) {
    auto ev = ch->get_event(lab->runtime().now_ns() + within);
    EXPECT_FALSE(ev.has_value()) << "unexpected " << to_string(ev->event);
    return !ev.has_value();
  }

  void make_qp(CmId& on) {
    pd = on.context()->alloc_pd();
    cq = on.context()->create_cq(64);
    QpInitAttr a;
    a.send_cq = cq;
    a.recv_cq = cq;
    on.create_qp(*pd, a);
  }

  void listen(uint16_t port = kPort, int backlog = 8) {
    listener = ch->create_id();
    listener->listen(port, backlog);
  }

  // rdma_create_id, resolve address and route, QP, then rdma_connect.
  void start_connect(const std::string& dst, uint16_t port = kPort, const CmTiming* t = nullptr) {
    id = ch->create_id();
    id->resolve_addr(dst, port, kNsPerSec);
    EXPECT_EQ(next().event, CmEventType::ADDR_RESOLVED);
    id->resolve_route(kNsPerSec);
    EXPECT_EQ(next().event, CmEventType::ROUTE_RESOLVED);
    make_qp(*id);
    if (t) id->set_timing(*t);
    id->connect(ConnParam{});
  }

  // Reads CONNECT_REQUEST, gives the new id a QP and accepts.
  void accept_next() {
    CmEvent ev = next();
    ASSERT_EQ(ev.event, CmEventType::CONNECT_REQUEST);
    EXPECT_EQ(ev.listen_id, listener->id());
    id = ch->find_id(ev.id);
    make_qp(*id);
    id->accept(ConnParam{});
  }
};

// Connects client to server (listening on `port`); returns the time the REQ went out.
inline TimeNs connect_pair(CmEnd& server, CmEnd& client, const std::string& server_host) {
  server.listen();
  client.start_connect(server_host);
  const TimeNs t0 = client.lab->runtime().now_ns();
  server.accept_next();
  client.expect(CmEventType::ESTABLISHED, 0, t0 + 2 * kLatency);
  server.expect(CmEventType::ESTABLISHED, 0, t0 + 3 * kLatency);
  return t0;
}

// The wire-fault rule that drops CM MADs with this attribute ID (every one, or the first count).
inline nlohmann::json drop_mad(uint16_t attr_id, int count = -1) {
  nlohmann::json rule = {{"action", "drop"}, {"opcode", "MAD"}, {"mad_attr_id", attr_id}};
  if (count > 0) rule["count"] = count;
  return rule;
}

inline size_t count_records(ModelLab& lab, const std::string& kind, const std::string& key,
                            const std::string& value) {
  size_t n = 0;
  for (const auto& r : lab.history().snapshot()) {
    n += r.kind == kind && r.data.contains(key) && r.data[key] == value;
  }
  return n;
}

}  // namespace rdmalab::model::testing
