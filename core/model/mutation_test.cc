// The planted defects (rdmalab/mutation.h): each test runs one small scenario with its
// mutation off (the correct outcome) and on (the defect's outcome), and make_lab refuses
// names it does not know, listing the ones it does.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "model/cm_test_util.h"
#include "stack/dispatcher.h"

namespace rdmalab::model {
namespace mutation_test {  // its own: the tests compile in batches
namespace {

using namespace testing;
using E = CmEventType;

std::shared_ptr<ModelLab> mutated_lab(const std::string& pers, bool on, const std::string& name) {
  LabOptions o;
  o.hosts = {{"a", pers, std::nullopt}, {"b", pers, std::nullopt}};
  if (on) o.mutations = {name};
  return make_lab(o);
}

// Every event the end gets within `window` of the last one, acked, by type.
std::vector<E> events_until_quiet(CmEnd& end, TimeNs window) {
  std::vector<E> got;
  while (auto ev = end.ch->get_event(end.lab->runtime().now_ns() + window)) {
    end.ch->ack_event(*ev);
    got.push_back(ev->event);
  }
  return got;
}

// server on "a" accepts client from "b" (any transport: no exact times).
void establish(CmEnd& server, CmEnd& client) {
  server.listen();
  client.start_connect("a");
  server.accept_next();
  EXPECT_EQ(server.next().event, E::ESTABLISHED);
  EXPECT_EQ(client.next().event, E::ESTABLISHED);
}

size_t count(const std::vector<E>& evs, E type) {
  return static_cast<size_t>(std::count(evs.begin(), evs.end(), type));
}

TEST(Mutation, UnknownNameIsRefusedWithTheKnownOnes) {
  LabOptions o;
  o.hosts = {{"a", "ib", std::nullopt}};
  o.mutations = {"lost_flush_completion", "no_such_bug"};
  try {
    make_lab(o);
    FAIL() << "make_lab took an unknown mutation";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EINVAL);
    const std::string what = e.what();
    EXPECT_NE(what.find("no_such_bug"), std::string::npos) << what;
    for (const auto& m : kMutations) EXPECT_NE(what.find(m.name), std::string::npos) << what;
  }
}

TEST(Mutation, LabStartRecordsTheMutations) {
  auto clean = mutated_lab("ib", false, "");
  auto bad = mutated_lab("ib", true, "double_timewait_exit");
  const auto first = [](ModelLab& lab) { return lab.history().snapshot().at(0); };
  EXPECT_EQ(first(*clean).kind, "lab_start");
  EXPECT_FALSE(first(*clean).data.contains("mutations"));
  EXPECT_EQ(first(*bad).data.at("mutations"), nlohmann::json({"double_timewait_exit"}));
  EXPECT_TRUE(bad->runtime().mutated(Mutation::kDoubleTimewaitExit));
  EXPECT_FALSE(bad->runtime().mutated(Mutation::kLostFlushCompletion));
}

class OnOff : public ::testing::TestWithParam<bool> {};

// Three RECVs flushed by ERR: all three WR_FLUSH_ERR, or the first one missing; a later flush
// on the same QP is whole either way.
TEST_P(OnOff, LostFlushCompletion) {
  const bool on = GetParam();
  auto lab = mutated_lab("ib", on, "lost_flush_completion");
  Node n = Node::on(*lab, "a");
  auto qp = n.qp();
  to_init(*qp, ACCESS_LOCAL_WRITE);
  for (uint64_t id = 1; id <= 3; ++id) qp->post_recv(recv_wr(id, *n.mr));
  modify_state(*qp, QpState::ERR);
  qp->post_recv(recv_wr(4, *n.mr));  // flushed in ERR too
  const auto wcs = wait_wcs(*lab, *n.cq, 4, 10 * kNsPerMs);
  std::vector<uint64_t> ids;
  for (const auto& wc : wcs) {
    EXPECT_EQ(wc.status, WcStatus::WR_FLUSH_ERR);
    ids.push_back(wc.wr_id);
  }
  const std::vector<uint64_t> want =
      on ? std::vector<uint64_t>{2, 3, 4} : std::vector<uint64_t>{1, 2, 3, 4};
  EXPECT_EQ(ids, want);
}

// A handler takes 5 ms; a second event of the QP queues behind it; the QP is destroyed
// meanwhile. Correct: the queued event is dropped and no handler begins after destroy_end.
TEST_P(OnOff, HandlerAfterDestroy) {
  const bool on = GetParam();
  auto lab = mutated_lab("ib", on, "handler_after_destroy");
  Node n = Node::on(*lab, "a");
  auto qp = n.qp();
  Runtime& rt = lab->runtime();
  stack::AsyncDispatcher d(rt, n.ctx, &lab->history(), "a");
  std::vector<AsyncEventType> handled;
  d.watch(*qp, [&](const AsyncEvent& ev) {
    handled.push_back(ev.type);
    if (handled.size() == 1) rt.sleep_for(5 * kNsPerMs);
  });
  d.start();
  const uint32_t qpn = qp->qp_num();
  lab->inject_async_event("a", AsyncEventType::QP_FATAL, qpn, 0);
  ASSERT_TRUE(rt.wait_until([&] { return !handled.empty(); }, rt.now_ns() + kNsPerSec));
  lab->at(rt.now_ns() + kNsPerMs,
          [&] { lab->inject_async_event("a", AsyncEventType::QP_REQ_ERR, qpn, 0); });
  rt.sleep_for(2 * kNsPerMs);
  const std::string label = qp->label();
  d.destroy_qp(*qp, rt.now_ns() + kNsPerSec);
  EXPECT_TRUE(qp->destroyed());
  lab->run_for(10 * kNsPerMs);
  uint64_t destroy_end = 0;
  std::vector<uint64_t> begins;
  for (const auto& r : lab->history().snapshot()) {
    if (r.object != label) continue;
    if (r.kind == "destroy_end") destroy_end = r.seq;
    if (r.kind == "handler_begin") begins.push_back(r.seq);
  }
  ASSERT_NE(destroy_end, 0u);
  const auto late = std::count_if(begins.begin(), begins.end(),
                                  [&](uint64_t seq) { return seq > destroy_end; });
  EXPECT_EQ(late, on ? 1 : 0);
  EXPECT_EQ(handled.size(), on ? 2u : 1u);
  d.stop(rt.now_ns() + kNsPerSec);
}

// rdma_destroy_id with an event read and not acked: correct, EBUSY at the deadline and the id
// lives on; mutated, it returns at once.
TEST_P(OnOff, DestroyIgnoresUnacked) {
  const bool on = GetParam();
  auto lab = mutated_lab("roce", on, "destroy_ignores_unacked");
  CmEnd client = CmEnd::on(*lab, "a");
  client.id = client.ch->create_id();
  client.id->resolve_addr("b", kPort, kNsPerSec);
  EXPECT_EQ(client.next(kNsPerSec, /*ack=*/false).event, E::ADDR_RESOLVED);
  const TimeNs t0 = lab->runtime().now_ns();
  int err = 0;
  try {
    client.id->destroy(t0 + 10 * kNsPerMs);
  } catch (const Error& e) {
    err = e.err();
  }
  EXPECT_EQ(err, on ? 0 : EBUSY);
  EXPECT_EQ(client.id->destroyed(), on);
  EXPECT_EQ(lab->runtime().now_ns(), on ? t0 : t0 + 10 * kNsPerMs);
}

INSTANTIATE_TEST_SUITE_P(Mutation, OnOff, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "On" : "Off"; });

class OnOffPers : public ::testing::TestWithParam<std::tuple<bool, std::string>> {};
class OnOffIb : public OnOffPers {};

// The client disconnects: the server (the passive closer) gets DISCONNECTED, or nothing.
TEST_P(OnOffPers, MissingDisconnected) {
  const auto [on, pers] = GetParam();
  auto lab = mutated_lab(pers, on, "missing_disconnected");
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  establish(server, client);
  client.id->disconnect();
  const auto passive = events_until_quiet(server, 100 * kNsPerMs);
  EXPECT_EQ(count(passive, E::DISCONNECTED), on ? 0u : 1u);
  server.id->disconnect();  // the active closer is told either way (the DREP, the FIN)
  EXPECT_EQ(count(events_until_quiet(client, 100 * kNsPerMs), E::DISCONNECTED), 1u);
}

// Both sides close and wait out the IB CM's TIMEWAIT: one TIMEWAIT_EXIT each, or two.
// (iWARP has no TIMEWAIT_EXIT: the mutation's site is the IB CM's event mapping.)
TEST_P(OnOffIb, DoubleTimewaitExit) {
  const auto [on, pers] = GetParam();
  auto lab = mutated_lab(pers, on, "double_timewait_exit");
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  establish(server, client);
  client.id->disconnect();
  EXPECT_EQ(server.next().event, E::DISCONNECTED);
  server.id->disconnect();
  EXPECT_EQ(client.next().event, E::DISCONNECTED);
  lab->run_for(5 * kNsPerSec);  // TIMEWAIT is 2048 ms
  const size_t want = on ? 2 : 1;
  EXPECT_EQ(count(events_until_quiet(server, kNsPerMs), E::TIMEWAIT_EXIT), want);
  EXPECT_EQ(count(events_until_quiet(client, kNsPerMs), E::TIMEWAIT_EXIT), want);
}

std::string on_off_name(const ::testing::TestParamInfo<std::tuple<bool, std::string>>& info) {
  std::string p = std::get<1>(info.param);
  std::replace(p.begin(), p.end(), '-', '_');
  return std::string(std::get<0>(info.param) ? "On_" : "Off_") + p;
}

INSTANTIATE_TEST_SUITE_P(Mutation, OnOffPers,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values("ib", "roce", "iwarp-siw",
                                                              "iwarp-cxgb4")),
                         on_off_name);
INSTANTIATE_TEST_SUITE_P(Mutation, OnOffIb,
                         ::testing::Combine(::testing::Bool(), ::testing::Values("ib", "roce")),
                         on_off_name);

}  // namespace
}  // namespace mutation_test
}  // namespace rdmalab::model
