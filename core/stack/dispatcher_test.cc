// AsyncDispatcher on the model (seed 001, seed 002): destroy waits for a running handler; no
// handler starts after destroy returns; per-object FIFO, one handler per object at a time;
// QPN reuse never delivers the old QP's event to the new QP; the ack-before-destroy rule.
#include "stack/dispatcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "rdmalab/error.h"
#include "stack/test_lab.h"

namespace rdmalab::stack {
namespace dispatcher_test {  // its own: the tests compile in batches
namespace {

using fixture::TwoHosts;

std::vector<HistoryRecord> records(History& h, const std::string& object, const std::string& kind) {
  std::vector<HistoryRecord> out;
  for (auto& r : h.snapshot()) {
    if (r.object == object && r.kind == kind) out.push_back(r);
  }
  return out;
}

struct Call {
  AsyncEvent ev;
  TimeNs begin_ns = 0;
  TimeNs end_ns = 0;
};

// A handler that takes handle_ns of (virtual) time and logs what it saw.
AsyncHandler slow_handler(Runtime& rt, std::vector<Call>& calls, TimeNs handle_ns) {
  return [&rt, &calls, handle_ns](const AsyncEvent& ev) {
    calls.push_back({ev, rt.now_ns(), 0});
    const size_t i = calls.size() - 1;
    rt.sleep_for(handle_ns);
    calls[i].end_ns = rt.now_ns();
  };
}

TEST(DispatcherTest, DestroyWaitsForRunningHandler) {
  TwoHosts lab("ib");
  auto qp = lab.create_rc(lab.a);
  AsyncDispatcher d(lab.rt(), lab.a.ctx, &lab.history(), "a");
  std::vector<Call> calls;
  d.watch(*qp, slow_handler(lab.rt(), calls, 5 * kNsPerMs));
  d.start();
  lab.lab->inject_async_event("a", AsyncEventType::QP_FATAL, qp->qp_num(), 0);
  ASSERT_TRUE(lab.rt().wait_until([&] { return !calls.empty(); }, lab.in(kNsPerSec)));
  // seed 002: the backend object is freed only once no handler holds it.
  bool handler_done_at_backend_destroy = false;
  int backend_destroys = 0;
  lab.lab->set_verb_hook([&](const model::VerbCall& call) {
    if (call.verb != "ibv_destroy_qp") return;
    ++backend_destroys;
    handler_done_at_backend_destroy = calls[0].end_ns != 0;
  });
  const std::string label = qp->label();
  d.destroy_qp(*qp, lab.in(kNsPerSec));
  lab.lab->set_verb_hook(nullptr);
  EXPECT_TRUE(qp->destroyed());
  EXPECT_EQ(backend_destroys, 1);
  EXPECT_TRUE(handler_done_at_backend_destroy) << "ibv_destroy_qp entered while the handler ran";
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_NE(calls[0].end_ns, 0) << "destroy returned while the handler was running";
  const auto end = records(lab.history(), label, "handler_end");
  const auto destroyed = records(lab.history(), label, "destroy_end");
  ASSERT_EQ(end.size(), 1u);
  ASSERT_EQ(destroyed.size(), 1u);
  EXPECT_GE(destroyed[0].t_ns, end[0].t_ns);
  EXPECT_GT(destroyed[0].seq, end[0].seq);
  EXPECT_GE(destroyed[0].t_ns, calls[0].begin_ns + 5 * kNsPerMs);
  EXPECT_EQ(d.stats().max_concurrent_per_object, 1);
  d.stop(lab.in(kNsPerSec));
}

TEST(DispatcherTest, EventAtDestroyEntryNeverReachesHandler) {
  TwoHosts lab("ib");
  auto qp = lab.create_rc(lab.a);
  AsyncDispatcher d(lab.rt(), lab.a.ctx, &lab.history(), "a");
  int handled = 0;
  d.watch(*qp, [&](const AsyncEvent&) { ++handled; });
  d.start();
  const uint32_t qpn = qp->qp_num();
  int injected = 0;
  lab.lab->set_verb_hook([&](const model::VerbCall& call) {
    if (call.verb == "ibv_destroy_qp" && call.qp_num == qpn) {
      lab.lab->inject_async_event("a", AsyncEventType::QP_FATAL, qpn, 0);
      ++injected;
    }
  });
  const std::string label = qp->label();
  d.destroy_qp(*qp, lab.in(kNsPerSec));
  lab.lab->set_verb_hook(nullptr);
  lab.lab->run_for(100 * kNsPerMs);
  EXPECT_EQ(injected, 1);
  EXPECT_EQ(handled, 0);
  EXPECT_TRUE(records(lab.history(), label, "handler_begin").empty());
  d.stop(lab.in(kNsPerSec));
}

TEST(DispatcherTest, EventDuringDestroyWaitIsDroppedAndAcked) {
  TwoHosts lab("ib");
  auto qp = lab.create_rc(lab.a);
  AsyncDispatcher d(lab.rt(), lab.a.ctx, &lab.history(), "a");
  std::vector<Call> calls;
  d.watch(*qp, slow_handler(lab.rt(), calls, 5 * kNsPerMs));
  d.start();
  const uint32_t qpn = qp->qp_num();
  lab.lab->inject_async_event("a", AsyncEventType::QP_FATAL, qpn, 0);
  ASSERT_TRUE(lab.rt().wait_until([&] { return !calls.empty(); }, lab.in(kNsPerSec)));
  // Raised while destroy waits for the running handler: read, dropped and acked.
  lab.lab->at(lab.in(1 * kNsPerMs),
              [&] { lab.lab->inject_async_event("a", AsyncEventType::QP_REQ_ERR, qpn, 0); });
  const std::string label = qp->label();
  d.destroy_qp(*qp, lab.in(kNsPerSec));  // would be EBUSY if a read event were left unacked
  EXPECT_EQ(calls.size(), 1u);
  EXPECT_EQ(records(lab.history(), label, "event_dropped_after_destroy").size(), 1u);
  EXPECT_EQ(d.stats().dropped, 1u);
  d.stop(lab.in(kNsPerSec));
}

TEST(DispatcherTest, PerObjectOrderAndOneHandlerAtATime) {
  TwoHosts lab("ib", 7);
  auto q1 = lab.create_rc(lab.a);
  auto q2 = lab.create_rc(lab.a);
  AsyncDispatcher d(lab.rt(), lab.a.ctx, &lab.history(), "a", 2);
  std::map<uint64_t, std::vector<Call>> calls;
  d.watch(*q1, slow_handler(lab.rt(), calls[q1->id()], 1 * kNsPerMs));
  d.watch(*q2, slow_handler(lab.rt(), calls[q2->id()], 1 * kNsPerMs));
  d.start();
  const AsyncEventType types[] = {AsyncEventType::QP_FATAL, AsyncEventType::QP_REQ_ERR,
                                  AsyncEventType::QP_ACCESS_ERR};
  for (int i = 0; i < 12; ++i) {
    const auto& qp = i % 2 == 0 ? q1 : q2;
    lab.lab->inject_async_event("a", types[(i / 2) % 3], qp->qp_num(), 0);
  }
  ASSERT_TRUE(lab.rt().wait_until(
      [&] {
        return calls[q1->id()].size() == 6 && calls[q2->id()].size() == 6 &&
               calls[q2->id()].back().end_ns != 0 && calls[q1->id()].back().end_ns != 0;
      },
      lab.in(kNsPerSec)));
  bool overlap_across = false;
  for (auto& [id, list] : calls) {
    for (size_t i = 0; i < list.size(); ++i) {
      EXPECT_EQ(list[i].ev.object_id, id);
      EXPECT_EQ(list[i].ev.type, types[i % 3]) << "arrival order kept";
      if (i > 0) {
        EXPECT_GT(list[i].ev.seq, list[i - 1].ev.seq);
        EXPECT_GE(list[i].begin_ns, list[i - 1].end_ns) << "handlers of one object overlapped";
      }
    }
  }
  for (const auto& c1 : calls[q1->id()]) {
    for (const auto& c2 : calls[q2->id()]) {
      overlap_across = overlap_across || (c1.begin_ns < c2.end_ns && c2.begin_ns < c1.end_ns);
    }
  }
  EXPECT_TRUE(overlap_across) << "two objects should be handled in parallel by two workers";
  EXPECT_EQ(d.stats().max_concurrent_per_object, 1);
  EXPECT_EQ(d.stats().delivered, 12u);
  EXPECT_EQ(d.events_for(q1->id()).size(), 6u);
  d.stop(lab.in(kNsPerSec));
}

TEST(DispatcherTest, UnackedEventMakesBackendDestroyBusy) {
  TwoHosts lab("ib");
  auto qp = lab.create_rc(lab.a);
  lab.lab->inject_async_event("a", AsyncEventType::QP_FATAL, qp->qp_num(), 0);
  auto ev = lab.a.ctx->get_async_event(lab.in(kNsPerSec));
  ASSERT_TRUE(ev.has_value());
  try {
    qp->destroy(lab.in(10 * kNsPerMs));
    FAIL() << "destroy succeeded with a read, unacked event";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EBUSY);
  }
  EXPECT_FALSE(qp->destroyed());
  lab.a.ctx->ack_async_event(*ev);
  qp->destroy(lab.in(10 * kNsPerMs));
  EXPECT_TRUE(qp->destroyed());
}

TEST(DispatcherTest, DestroyDeadlineWhileHandlerRunsThenRetry) {
  TwoHosts lab("ib");
  auto qp = lab.create_rc(lab.a);
  AsyncDispatcher d(lab.rt(), lab.a.ctx, &lab.history(), "a");
  std::vector<Call> calls;
  d.watch(*qp, slow_handler(lab.rt(), calls, 50 * kNsPerMs));
  d.start();
  lab.lab->inject_async_event("a", AsyncEventType::QP_FATAL, qp->qp_num(), 0);
  ASSERT_TRUE(lab.rt().wait_until([&] { return !calls.empty(); }, lab.in(kNsPerSec)));
  EXPECT_THROW(d.destroy_qp(*qp, lab.in(10 * kNsPerMs)), DeadlineExceeded);
  EXPECT_FALSE(qp->destroyed()) << "the backend destroy must wait for the handler";
  d.destroy_qp(*qp, lab.in(kNsPerSec));
  EXPECT_TRUE(qp->destroyed());
  EXPECT_NE(calls[0].end_ns, 0);
  d.stop(lab.in(kNsPerSec));
}

TEST(DispatcherTest, DestroyFromOwnHandlerIsRefused) {
  TwoHosts lab("ib");
  auto qp = lab.create_rc(lab.a);
  AsyncDispatcher d(lab.rt(), lab.a.ctx, &lab.history(), "a");
  int err = 0;
  d.watch(*qp, [&](const AsyncEvent&) {
    try {
      d.destroy_qp(*qp, lab.in(kNsPerSec));
    } catch (const Error& e) {
      err = e.err();
    }
  });
  d.start();
  lab.lab->inject_async_event("a", AsyncEventType::QP_FATAL, qp->qp_num(), 0);
  ASSERT_TRUE(lab.rt().wait_until([&] { return err != 0; }, lab.in(kNsPerSec)));
  EXPECT_EQ(err, EDEADLK);
  d.destroy_qp(*qp, lab.in(kNsPerSec));
  EXPECT_TRUE(qp->destroyed());
  d.stop(lab.in(kNsPerSec));
}

// seed 002: mana hands the freed QPN to the next create; the old QP's event must not reach
// the new QP's handler, and the new QP's own event must.
TEST(DispatcherTest, ReusedQpnGetsOnlyItsOwnEvents) {
  TwoHosts lab("mana");
  auto old_qp = lab.create_rc(lab.a);
  AsyncDispatcher d(lab.rt(), lab.a.ctx, &lab.history(), "a");
  int old_handled = 0;
  d.watch(*old_qp, [&](const AsyncEvent&) { ++old_handled; });
  d.start();
  const uint32_t qpn = old_qp->qp_num();
  d.destroy_qp(*old_qp, lab.in(kNsPerSec));
  auto new_qp = lab.create_rc(lab.a);
  ASSERT_EQ(new_qp->qp_num(), qpn) << "mana reuses a freed QPN";
  std::vector<AsyncEvent> got;
  d.watch(*new_qp, [&](const AsyncEvent& ev) { got.push_back(ev); });
  lab.lab->inject_async_event("a", AsyncEventType::QP_FATAL, qpn, 0);
  ASSERT_TRUE(lab.rt().wait_until([&] { return !got.empty(); }, lab.in(kNsPerSec)));
  EXPECT_EQ(got[0].object_id, new_qp->id());
  EXPECT_EQ(old_handled, 0);
  d.stop(lab.in(kNsPerSec));
}

TEST(DispatcherTest, UnaffiliatedEventsGoToDefaultHandler) {
  TwoHosts lab("roce");
  AsyncDispatcher d(lab.rt(), lab.a.ctx, &lab.history(), "a");
  std::vector<AsyncEventType> got;
  d.set_default_handler([&](const AsyncEvent& ev) { got.push_back(ev.type); });
  d.start();
  lab.lab->set_port_state("a", false);
  lab.lab->set_port_state("a", true);
  ASSERT_TRUE(lab.rt().wait_until([&] { return got.size() == 2; }, lab.in(kNsPerSec)));
  EXPECT_EQ(got,
            (std::vector<AsyncEventType>{AsyncEventType::PORT_ERR, AsyncEventType::PORT_ACTIVE}));
  EXPECT_EQ(d.stats().unaffiliated, 2u);
  d.stop(lab.in(kNsPerSec));
  EXPECT_FALSE(d.running());
}

TEST(DispatcherTest, WatchTwiceIsRefused) {
  TwoHosts lab("ib");
  auto qp = lab.create_rc(lab.a);
  AsyncDispatcher d(lab.rt(), lab.a.ctx, &lab.history(), "a");
  d.watch(*qp, [](const AsyncEvent&) {});
  try {
    d.watch(*qp, [](const AsyncEvent&) {});
    FAIL() << "second watch accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EEXIST);
  }
}

TEST(DispatcherTest, StopFinishesRunningHandlerAndAcksQueuedEvents) {
  TwoHosts lab("ib");
  auto qp = lab.create_rc(lab.a);
  AsyncDispatcher d(lab.rt(), lab.a.ctx, &lab.history(), "a");
  std::vector<Call> calls;
  d.watch(*qp, slow_handler(lab.rt(), calls, 5 * kNsPerMs));
  d.start();
  for (int i = 0; i < 3; ++i) {
    lab.lab->inject_async_event("a", AsyncEventType::QP_FATAL, qp->qp_num(), 0);
  }
  ASSERT_TRUE(lab.rt().wait_until([&] { return d.stats().read == 3 && !calls.empty(); },
                                  lab.in(kNsPerSec)));
  d.stop(lab.in(kNsPerSec));
  EXPECT_FALSE(d.running());
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_NE(calls[0].end_ns, 0) << "stop returned while a handler ran";
  EXPECT_EQ(d.stats().dropped, 2u);
  qp->destroy(lab.in(10 * kNsPerMs));  // EBUSY if a read event were left unacked
  EXPECT_TRUE(qp->destroyed());
}

// The error for an object of another context: EINVAL, naming the kind and both contexts.
std::string foreign_detail(const char* kind, const Object& obj, const Context& of,
                           const std::string& of_host, const Context& through,
                           const std::string& through_host) {
  return std::string(kind) + " " + obj.label() + " is of " + of.label() + " on host " + of_host +
         ", not of " + through.label() + " on host " + through_host;
}

template <class F>
Error error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  return Error("none", 0, "no error");
}

TEST(DispatcherTest, RefusesObjectsOfAnotherContext) {
  TwoHosts lab("ib");
  auto qa = lab.create_rc(lab.a);
  AsyncDispatcher d(lab.rt(), lab.b.ctx, &lab.history(), "b");
  std::vector<Call> calls;
  d.start();
  const Error watch = error_of([&] { d.watch(*qa, slow_handler(lab.rt(), calls, 0)); });
  EXPECT_EQ(watch.err(), EINVAL);
  EXPECT_EQ(watch.verb(), "AsyncDispatcher::watch");
  EXPECT_EQ(watch.detail(), foreign_detail("qp", *qa, *lab.a.ctx, "a", *lab.b.ctx, "b"));
  const Error destroy = error_of([&] { d.destroy_qp(*qa, lab.in(kNsPerSec)); });
  EXPECT_EQ(destroy.err(), EINVAL);
  EXPECT_EQ(destroy.detail(), foreign_detail("qp", *qa, *lab.a.ctx, "a", *lab.b.ctx, "b"));
  const Error cq = error_of([&] { d.destroy_cq(*lab.a.cq, lab.in(kNsPerSec)); });
  EXPECT_EQ(cq.detail(), foreign_detail("cq", *lab.a.cq, *lab.a.ctx, "a", *lab.b.ctx, "b"));
  EXPECT_FALSE(qa->destroyed());
  EXPECT_TRUE(records(lab.history(), qa->label(), "destroy_begin").empty());
  lab.lab->inject_async_event("a", AsyncEventType::QP_FATAL, qa->qp_num(), 0);
  lab.rt().sleep_for(kNsPerMs);
  EXPECT_EQ(d.stats().read, 0u);  // a's event is a's context's
  d.stop(lab.in(kNsPerSec));
}

TEST(DispatcherTest, RaisingHandlerIsRecordedWithItsHandlerAndError) {
  TwoHosts lab("ib");
  auto qp = lab.create_rc(lab.a);
  AsyncDispatcher d(lab.rt(), lab.a.ctx, &lab.history(), "a");
  d.watch(*qp, [](const AsyncEvent&) { throw std::runtime_error("handler bug"); });
  d.start();
  lab.lab->inject_async_event("a", AsyncEventType::QP_FATAL, qp->qp_num(), 0);
  ASSERT_TRUE(d.wait_event(qp->id(), AsyncEventType::QP_FATAL, lab.in(kNsPerSec)));
  const auto errs = records(lab.history(), qp->label(), "handler_error");
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_EQ(errs[0].data.at("handler"), qp->label());
  EXPECT_EQ(errs[0].data.at("error"), "handler bug");
  EXPECT_EQ(errs[0].data.at("event"), "QP_FATAL");
  EXPECT_EQ(d.stats().handler_errors, 1u);
  d.stop(lab.in(kNsPerSec));
}

}  // namespace
}  // namespace dispatcher_test
}  // namespace rdmalab::stack
