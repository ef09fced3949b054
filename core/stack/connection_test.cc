// CmEventPump and the connect / accept helpers on the model (seed 001): connect and
// disconnect through the pump on IB and iWARP; every event recorded per id in order; every
// event acked, so destroy never blocks on the pump; destroy drops queued events and waits
// for a running handler; events of one id handled one at a time.
#include "stack/connection.h"

#include <gtest/gtest.h>

#include <map>

#include "model/sim_runtime.h"
#include "rdmalab/error.h"
#include "stack/test_lab.h"

namespace rdmalab::stack {
namespace {

using fixture::TwoHosts;

constexpr uint16_t kPort = 7471;

std::vector<HistoryRecord> records(History& h, const std::string& object, const std::string& kind) {
  std::vector<HistoryRecord> out;
  for (auto& r : h.snapshot()) {
    if (r.object == object && r.kind == kind) out.push_back(r);
  }
  return out;
}

std::vector<CmEventType> types_of(const std::vector<CmEventRecord>& events) {
  std::vector<CmEventType> out;
  out.reserve(events.size());
  for (const auto& r : events) out.push_back(r.event.event);
  return out;
}

// Client on host a, server on host b, each with its own channel and pump.
struct CmLab {
  explicit CmLab(const std::string& personality, uint64_t seed = 1)
      : lab(personality, seed),
        client(lab.rt(), lab.a.proc->create_event_channel(), &lab.history(), "a"),
        server(lab.rt(), lab.b.proc->create_event_channel(), &lab.history(), "b") {
    client.start();
    server.start();
  }
  ~CmLab() {
    client.stop(lab.in(kNsPerSec));
    server.stop(lab.in(kNsPerSec));
  }

  CmEndpointSpec spec() const {
    CmEndpointSpec s;
    s.dst = "b";
    s.port = kPort;
    return s;
  }

  // Listens, connects, accepts: both sides ESTABLISHED.
  std::pair<CmConnection, CmConnection> connected(std::shared_ptr<CmId>& listener) {
    listener = cm_listen(server, kPort);
    CmConnection c = cm_connect(client, spec(), lab.in(kNsPerSec));
    auto req = server.next_connect_request(listener->id(), lab.in(kNsPerSec));
    EXPECT_TRUE(req.has_value());
    CmConnection s = cm_accept(server, server.channel().find_id(req->id), spec());
    cm_await(client, *c.id, CmEventType::ESTABLISHED, lab.in(kNsPerSec), "active side");
    cm_await(server, *s.id, CmEventType::ESTABLISHED, lab.in(kNsPerSec), "passive side");
    return {c, s};
  }

  TwoHosts lab;
  CmEventPump client;
  CmEventPump server;
};

class CmConnectTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CmConnectTest, ConnectSendDisconnectInOrder) {
  CmLab t(GetParam());
  const bool ib = t.lab.a.ctx->caps().transport != Transport::iWARP;
  std::shared_ptr<CmId> listener;
  auto conns = t.connected(listener);  // not a structured binding: the lambdas below use them
  CmConnection& c = conns.first;
  CmConnection& s = conns.second;
  EXPECT_EQ(c.qp->state(), QpState::RTS);
  EXPECT_EQ(s.qp->state(), QpState::RTS);

  // The QPs the CM brought up carry traffic.
  auto ctx_b = s.id->context();
  auto mr_b = ctx_b->reg_mr(*s.pd, 4096, ACCESS_LOCAL_WRITE);
  auto mr_c = c.id->context()->reg_mr(*c.pd, 4096, ACCESS_LOCAL_WRITE);
  s.qp->post_recv(RecvWr{1, {Sge{mr_b->addr(), 64, mr_b->lkey()}}});
  SendWr wr;
  wr.wr_id = 2;
  wr.sg_list = {Sge{mr_c->addr(), 64, mr_c->lkey()}};
  c.qp->post_send(wr);
  std::vector<WorkCompletion> got;
  ASSERT_TRUE(t.lab.rt().wait_until(
      [&] {
        for (auto& wc : s.cq->poll(4)) got.push_back(wc);
        return !got.empty();
      },
      t.lab.in(kNsPerSec)));
  EXPECT_EQ(got[0].status, WcStatus::SUCCESS);

  c.id->disconnect();
  cm_await(t.server, *s.id, CmEventType::DISCONNECTED, t.lab.in(kNsPerSec), "passive side");
  s.id->disconnect();  // rdma_cm: the passive side answers the peer's close itself
  cm_await(t.client, *c.id, CmEventType::DISCONNECTED, t.lab.in(kNsPerSec), "active side");
  std::vector<CmEventType> want_c = {CmEventType::ADDR_RESOLVED, CmEventType::ROUTE_RESOLVED,
                                     CmEventType::ESTABLISHED, CmEventType::DISCONNECTED};
  std::vector<CmEventType> want_s = {CmEventType::CONNECT_REQUEST, CmEventType::ESTABLISHED,
                                     CmEventType::DISCONNECTED};
  if (ib) {  // IB leaves TIMEWAIT with an event; iWARP never reports TIMEWAIT_EXIT
    cm_await(t.client, *c.id, CmEventType::TIMEWAIT_EXIT, t.lab.in(60 * kNsPerSec), "active side");
    cm_await(t.server, *s.id, CmEventType::TIMEWAIT_EXIT, t.lab.in(60 * kNsPerSec), "passive side");
    want_c.push_back(CmEventType::TIMEWAIT_EXIT);
    want_s.push_back(CmEventType::TIMEWAIT_EXIT);
  } else {
    t.lab.lab->run_for(5 * kNsPerSec);
  }
  EXPECT_EQ(types_of(t.client.events(c.id->id())), want_c);
  EXPECT_EQ(types_of(t.server.events(s.id->id())), want_s);
  EXPECT_EQ(types_of(t.server.events(listener->id())),
            std::vector<CmEventType>{CmEventType::CONNECT_REQUEST});
  const auto recs = t.client.events(c.id->id());
  for (size_t i = 1; i < recs.size(); ++i) {
    EXPECT_GT(recs[i].event.seq, recs[i - 1].event.seq);
    EXPECT_GE(recs[i].read_ns, recs[i - 1].read_ns);
  }
  mr_b->dereg();
  mr_c->dereg();
  cm_close(t.client, c, t.lab.in(kNsPerMs));  // every event was acked: nothing to wait for
  cm_close(t.server, s, t.lab.in(kNsPerMs));
  t.server.destroy_id(*listener, t.lab.in(kNsPerMs));
  EXPECT_TRUE(c.id->destroyed() && s.id->destroyed() && listener->destroyed());
  EXPECT_EQ(records(t.lab.history(), c.id->label(), "cm_destroy_end").size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Personalities, CmConnectTest,
                         ::testing::Values("ib", "roce", "iwarp-cxgb4", "iwarp-siw"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

TEST(CmPumpTest, UnackedEventMakesDestroyBusyButPumpedOneDoesNot) {
  TwoHosts lab("ib");
  auto ch = lab.a.proc->create_event_channel();
  auto raw = ch->create_id();
  raw->resolve_addr("b", kPort, kNsPerSec);
  auto ev = ch->get_event(lab.in(kNsPerSec));
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->event, CmEventType::ADDR_RESOLVED);
  try {
    raw->destroy(lab.in(10 * kNsPerMs));
    FAIL() << "rdma_destroy_id returned with an unacked event";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EBUSY);
  }
  ch->ack_event(*ev);
  raw->destroy(lab.in(10 * kNsPerMs));

  CmEventPump pump(lab.rt(), ch, &lab.history(), "a");
  pump.start();
  auto id = ch->create_id();
  int handled = 0;
  pump.watch(*id, [&](const CmEvent&) { ++handled; });
  id->resolve_addr("b", kPort, kNsPerSec);
  ASSERT_TRUE(pump.wait_event(id->id(), CmEventType::ADDR_RESOLVED, lab.in(kNsPerSec)));
  ASSERT_TRUE(lab.rt().wait_until([&] { return handled == 1; }, lab.in(kNsPerSec)));
  pump.destroy_id(*id, lab.in(kNsPerMs));
  EXPECT_TRUE(id->destroyed());
  EXPECT_EQ(pump.stats().delivered, 1u);
  pump.stop(lab.in(kNsPerSec));
}

// Handler workers start with the first handler: a pump whose events all go unhandled (acked
// as read) runs its event thread alone; watch() starts the workers and the handler runs.
TEST(CmPumpTest, WorkersStartWithTheFirstHandler) {
  TwoHosts lab("ib");
  auto& sim = dynamic_cast<model::SimRuntime&>(lab.rt());
  auto has = [&sim](const std::string& name) {
    return sim.dump_threads().find(name) != std::string::npos;
  };
  CmEventPump pump(lab.rt(), lab.a.proc->create_event_channel(), &lab.history(), "a", 2);
  pump.start();
  EXPECT_TRUE(has("a:cm_events"));
  EXPECT_FALSE(has("a:cm_worker"));
  auto id = pump.channel().create_id();
  id->resolve_addr("b", kPort, kNsPerSec);
  ASSERT_TRUE(pump.wait_event(id->id(), CmEventType::ADDR_RESOLVED, lab.in(kNsPerSec)));
  EXPECT_EQ(pump.stats().unhandled, 1u);
  EXPECT_FALSE(has("a:cm_worker"));

  int handled = 0;
  pump.watch(*id, [&handled](const CmEvent&) { ++handled; });
  EXPECT_TRUE(has("a:cm_worker0"));
  EXPECT_TRUE(has("a:cm_worker1"));
  id->resolve_route(kNsPerSec);
  ASSERT_TRUE(lab.rt().wait_until([&handled] { return handled == 1; }, lab.in(kNsPerSec)));
  EXPECT_EQ(pump.stats().delivered, 1u);
  pump.destroy_id(*id, lab.in(kNsPerSec));
  pump.stop(lab.in(kNsPerSec));
  EXPECT_FALSE(has("a:cm_"));
}

struct Call {
  uint64_t id = 0;
  CmEventType event = CmEventType::ADDR_RESOLVED;
  TimeNs begin_ns = 0;
  TimeNs end_ns = 0;
};

CmHandler slow_handler(Runtime& rt, std::vector<Call>& calls, TimeNs handle_ns) {
  return [&rt, &calls, handle_ns](const CmEvent& ev) {
    calls.push_back({ev.id, ev.event, rt.now_ns(), 0});
    const size_t i = calls.size() - 1;
    rt.sleep_for(handle_ns);
    calls[i].end_ns = rt.now_ns();
  };
}

// Connection-level pump tests, on an IB and an iWARP personality.
class CmPumpTransportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CmPumpTransportTest, DestroyDropsQueuedEventsAndWaitsForRunningHandler) {
  CmLab t(GetParam());
  auto listener = cm_listen(t.server, kPort);
  CmConnection c = cm_connect(t.client, t.spec(), t.lab.in(kNsPerSec));
  auto req = t.server.next_connect_request(listener->id(), t.lab.in(kNsPerSec));
  ASSERT_TRUE(req.has_value());
  auto sid = t.server.channel().find_id(req->id);
  std::vector<Call> calls;
  t.server.watch(*sid, slow_handler(t.lab.rt(), calls, 50 * kNsPerMs));
  CmConnection s = cm_accept(t.server, sid, t.spec());
  cm_await(t.client, *c.id, CmEventType::ESTABLISHED, t.lab.in(kNsPerSec), "active side");
  ASSERT_TRUE(t.lab.rt().wait_until([&] { return !calls.empty(); }, t.lab.in(kNsPerSec)));
  c.id->disconnect();
  ASSERT_TRUE(t.server.wait_event(sid->id(), CmEventType::DISCONNECTED, t.lab.in(kNsPerSec)));
  ASSERT_EQ(calls.size(), 1u);
  ASSERT_EQ(calls[0].end_ns, 0) << "the ESTABLISHED handler should still be running";
  const std::string label = sid->label();
  cm_close(t.server, s, t.lab.in(kNsPerSec));
  EXPECT_TRUE(sid->destroyed());
  ASSERT_EQ(calls.size(), 1u) << "a queued event reached the handler after destroy";
  EXPECT_EQ(calls[0].event, CmEventType::ESTABLISHED);
  EXPECT_NE(calls[0].end_ns, 0) << "destroy returned while the handler ran";
  const auto dropped = records(t.lab.history(), label, "cm_event_dropped_after_destroy");
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].data["event"], "DISCONNECTED");
  const auto end = records(t.lab.history(), label, "cm_handler_end");
  const auto destroyed = records(t.lab.history(), label, "cm_destroy_end");
  ASSERT_EQ(end.size(), 1u);
  ASSERT_EQ(destroyed.size(), 1u);
  EXPECT_GT(destroyed[0].seq, end[0].seq);
  EXPECT_GE(destroyed[0].t_ns, calls[0].begin_ns + 50 * kNsPerMs);
  cm_close(t.client, c, t.lab.in(kNsPerSec));
}

// Events of one id one at a time and in order; two ids in parallel. The new ids inherit the
// listener's handler, which accepts from inside the CONNECT_REQUEST handler.
TEST_P(CmPumpTransportTest, PerIdSerialisationWithInheritedHandler) {
  CmLab t(GetParam(), 3);
  auto listener = cm_listen(t.server, kPort);
  std::map<uint64_t, std::vector<Call>> calls;
  std::map<uint64_t, CmConnection> accepted;
  t.server.watch(*listener, [&](const CmEvent& ev) {
    calls[ev.id].push_back({ev.id, ev.event, t.lab.rt().now_ns(), 0});
    auto& mine = calls[ev.id].back();
    if (ev.event == CmEventType::CONNECT_REQUEST) {
      accepted[ev.id] = cm_accept(t.server, t.server.channel().find_id(ev.id), t.spec());
    }
    t.lab.rt().sleep_for(2 * kNsPerMs);
    mine.end_ns = t.lab.rt().now_ns();
  });
  CmConnection c1 = cm_connect(t.client, t.spec(), t.lab.in(kNsPerSec));
  CmConnection c2 = cm_connect(t.client, t.spec(), t.lab.in(kNsPerSec));
  cm_await(t.client, *c1.id, CmEventType::ESTABLISHED, t.lab.in(kNsPerSec), "active side");
  cm_await(t.client, *c2.id, CmEventType::ESTABLISHED, t.lab.in(kNsPerSec), "active side");
  c1.id->disconnect();
  c2.id->disconnect();
  ASSERT_TRUE(t.lab.rt().wait_until(
      [&] {
        size_t done = 0;
        for (auto& [id, list] : calls) {
          if (list.size() == 3 && list.back().end_ns != 0) ++done;
        }
        return done == 2;
      },
      t.lab.in(kNsPerSec)));
  const std::vector<CmEventType> want = {CmEventType::CONNECT_REQUEST, CmEventType::ESTABLISHED,
                                         CmEventType::DISCONNECTED};
  bool overlap_across = false;
  for (auto& [id, list] : calls) {
    ASSERT_EQ(list.size(), want.size());
    for (size_t i = 0; i < list.size(); ++i) {
      EXPECT_EQ(list[i].event, want[i]);
      if (i > 0) {
        EXPECT_GE(list[i].begin_ns, list[i - 1].end_ns) << "handlers of one id overlapped";
      }
    }
    for (auto& [other, olist] : calls) {
      if (other == id) continue;
      for (auto& x : list) {
        for (auto& y : olist) {
          overlap_across = overlap_across || (x.begin_ns < y.end_ns && y.begin_ns < x.end_ns);
        }
      }
    }
  }
  EXPECT_TRUE(overlap_across) << "two ids should be handled in parallel by two workers";
  EXPECT_EQ(t.server.stats().max_concurrent_per_id, 1);
  EXPECT_EQ(t.server.events(listener->id()).size(), 2u);
  for (auto& [id, conn] : accepted) cm_close(t.server, conn, t.lab.in(kNsPerSec));
  t.server.destroy_id(*listener, t.lab.in(kNsPerSec));
  cm_close(t.client, c1, t.lab.in(kNsPerSec));
  cm_close(t.client, c2, t.lab.in(kNsPerSec));
}

INSTANTIATE_TEST_SUITE_P(Transports, CmPumpTransportTest, ::testing::Values("ib", "iwarp-siw"),
                         [](const auto& info) { return info.param == "ib" ? "ib" : "iwarp_siw"; });

TEST(CmPumpTest, DestroyFromOwnHandlerIsRefused) {
  TwoHosts lab("ib");
  CmEventPump pump(lab.rt(), lab.a.proc->create_event_channel(), &lab.history(), "a");
  pump.start();
  auto id = pump.channel().create_id();
  int err = 0;
  pump.watch(*id, [&](const CmEvent&) {
    try {
      pump.destroy_id(*id, lab.in(kNsPerSec));
    } catch (const Error& e) {
      err = e.err();
    }
  });
  id->resolve_addr("b", kPort, kNsPerSec);
  ASSERT_TRUE(lab.rt().wait_until([&] { return err != 0; }, lab.in(kNsPerSec)));
  EXPECT_EQ(err, EDEADLK);
  pump.destroy_id(*id, lab.in(kNsPerSec));
  EXPECT_TRUE(id->destroyed());
  pump.stop(lab.in(kNsPerSec));
}

TEST(CmPumpTest, ConnectWithoutListenerIsRejected) {
  CmLab t("ib");
  CmConnection c = cm_connect(t.client, t.spec(), t.lab.in(kNsPerSec));
  try {
    cm_await(t.client, *c.id, CmEventType::ESTABLISHED, t.lab.in(10 * kNsPerSec), "active side",
             {CmEventType::REJECTED, CmEventType::UNREACHABLE});
    FAIL() << "connected without a listener";
  } catch (const DeadlineExceeded&) {
    FAIL() << "should end at REJECTED, not at the deadline";
  } catch (const Error& e) {
    EXPECT_EQ(e.verb(), "rdma_get_cm_event");
    EXPECT_EQ(e.err(), ECONNREFUSED);
    EXPECT_NE(e.detail().find("REJECTED (status 8)"), std::string::npos) << e.detail();
  }
  cm_close(t.client, c, t.lab.in(kNsPerSec));
}

TEST(CmPumpTest, UnknownHostFailsResolveWithoutHanging) {
  CmLab t("ib");
  auto spec = t.spec();
  spec.dst = "nowhere";
  try {
    cm_connect(t.client, spec, t.lab.in(kNsPerSec));
    FAIL() << "resolved an unknown host";
  } catch (const DeadlineExceeded& e) {
    FAIL() << "hung: " << e.what();
  } catch (const Error& e) {
    EXPECT_EQ(e.verb(), "rdma_resolve_addr");
  }
}

TEST(CmPumpTest, StuckConnectNamesTheStep) {
  CmLab t("ib");
  auto listener = cm_listen(t.server, kPort);
  t.lab.cut_a_to_b();
  CmConnection c = cm_connect(t.client, t.spec(), t.lab.in(kNsPerSec));
  try {
    cm_await(t.client, *c.id, CmEventType::ESTABLISHED, t.lab.in(10 * kNsPerMs), "active side");
    FAIL() << "established across a cut link";
  } catch (const DeadlineExceeded& e) {
    const std::string& d = e.detail();
    EXPECT_NE(d.find("active side " + c.id->label() + " stuck in CONNECT"), std::string::npos) << d;
    EXPECT_NE(d.find("waiting for ESTABLISHED"), std::string::npos) << d;
    EXPECT_NE(d.find("ADDR_RESOLVED, ROUTE_RESOLVED"), std::string::npos) << d;
  }
  t.lab.lab->clear_rules();
  cm_close(t.client, c, t.lab.in(kNsPerSec));
  t.server.destroy_id(*listener, t.lab.in(kNsPerSec));
}

}  // namespace
}  // namespace rdmalab::stack
