// The model lab: personalities, QPN allocation, engine ids, determinism, kill, shutdown.
#include "model/model_lab.h"

#include <gtest/gtest.h>

#include "model/test_util.h"

namespace rdmalab::model {
namespace model_lab_test {  // its own: the tests compile in batches
namespace {

using namespace testing;

TEST(ModelLab, PersonalitiesAndCaps) {
  EXPECT_EQ(personalities(), (std::vector<std::string>{"roce", "ib", "ib-legacy", "iwarp-cxgb4",
                                                       "iwarp-siw", "mana"}));
  std::vector<std::pair<std::string, std::string>> hosts;
  for (const auto& p : personalities()) hosts.push_back({"h-" + p, p});
  auto lab = lab_of(hosts);
  auto caps = [&](const std::string& p) { return lab->host("h-" + p)->device_caps(""); };
  EXPECT_EQ(caps("roce").transport, Transport::RoCE);
  EXPECT_FALSE(caps("roce").xrc);
  EXPECT_TRUE(caps("roce").retry_cnt_7_infinite);
  EXPECT_TRUE(caps("ib").xrc);
  EXPECT_EQ(caps("ib").xrc_tgt_lifetime, XrcTgtLifetime::kHandle);
  EXPECT_EQ(caps("ib-legacy").xrc_tgt_lifetime, XrcTgtLifetime::kXrcd);
  EXPECT_EQ(caps("iwarp-cxgb4").err_post, ErrPostPolicy::kRefuse);
  EXPECT_EQ(caps("iwarp-siw").err_post, ErrPostPolicy::kStrand);  // libsiw, user QPs
  EXPECT_EQ(caps("ib").err_post, ErrPostPolicy::kFlush);
  EXPECT_FALSE(caps("mana").srq);
  EXPECT_FALSE(caps("roce").raises_event(AsyncEventType::QP_FATAL));
  EXPECT_TRUE(caps("mana").raises_event(AsyncEventType::QP_FATAL));
  EXPECT_EQ(caps("ib").name, "model-ib0");
  EXPECT_EQ(lab->host("h-ib")->device_names(), std::vector<std::string>{"model-ib0"});
  EXPECT_EQ(err_of([&] { lab->host("nope"); }), ENOENT);
  EXPECT_EQ(err_of([&] { lab_of({{"x", "bogus"}}); }), EINVAL);
  EXPECT_EQ(lab->backend(), "model");
}

std::vector<uint32_t> qpns_after_churn(const std::string& pers) {
  auto lab = lab_of({{"a", pers}});
  Node n = Node::on(*lab, "a");
  auto q1 = n.qp();
  auto q2 = n.qp();
  auto q3 = n.qp();
  q2->destroy(0);
  q3->destroy(0);
  auto q4 = n.qp();
  auto q5 = n.qp();
  return {q1->qp_num(), q2->qp_num(), q3->qp_num(), q4->qp_num(), q5->qp_num()};
}

TEST(ModelLab, QpnAllocationPerPersonality) {
  EXPECT_EQ(qpns_after_churn("roce"), (std::vector<uint32_t>{17, 18, 19, 20, 21}));
  EXPECT_EQ(qpns_after_churn("ib"), (std::vector<uint32_t>{0x100, 0x101, 0x102, 0x103, 0x104}));
  // mana: a freed QPN goes to the next create, most recently freed first.
  auto m = qpns_after_churn("mana");
  EXPECT_EQ(m[3], m[2]);
  EXPECT_EQ(m[4], m[1]);
}

TEST(ModelLab, EngineIdsComeFromOneCounterAndAreNeverReused) {
  auto lab = lab_of({{"a", "mana"}});
  Node n = Node::on(*lab, "a");
  EXPECT_EQ(n.ctx->id(), 1u);
  EXPECT_EQ(n.pd->id(), 2u);
  EXPECT_EQ(n.cq->id(), 3u);
  EXPECT_EQ(n.mr->id(), 4u);
  auto q1 = n.qp();
  EXPECT_EQ(q1->label(), "qp:5");
  q1->destroy(0);
  auto q2 = n.qp();
  EXPECT_EQ(q2->qp_num(), q1->qp_num());
  EXPECT_EQ(q2->id(), 6u);
}

std::string traffic_history(uint64_t seed) {
  auto lab = lab_of({{"a", "ib"}, {"b", "roce"}}, seed);
  lab->set_fabric(FabricOptions{2 * kNsPerUs, 3 * kNsPerUs, 150000});
  Node a = Node::on(*lab, "a");
  Node b = Node::on(*lab, "b");
  auto qa = a.qp();
  auto qb = b.qp();
  RcParams rp;
  rp.timeout = 6;
  connect(*qa, *a.ctx, *qb, *b.ctx, rp);
  for (int i = 0; i < 10; ++i) qb->post_recv(recv_wr(i, *b.mr));
  for (int i = 0; i < 10; ++i) qa->post_send(send_wr(i, *a.mr, 8, 0, i % 3 == 0));
  lab->runtime().spawn("poller", [&] {
    for (int i = 0; i < 20; ++i) {
      b.cq->poll(4);
      lab->runtime().sleep_for(50 * kNsPerUs);
    }
  });
  lab->run_for(50 * kNsPerMs);
  lab->inject_async_event("a", AsyncEventType::QP_FATAL, qa->qp_num(), kNsPerUs);
  read_events(*lab, *a.ctx);
  lab->run_for(kNsPerMs);
  return lab->history().to_jsonl();
}

TEST(ModelLab, SameSeedGivesAByteIdenticalHistory) {
  const std::string h1 = traffic_history(42);
  EXPECT_EQ(h1, traffic_history(42));
  EXPECT_NE(h1, traffic_history(43));  // the loss pattern differs
  EXPECT_NE(h1.find("\"kind\":\"fault\""), std::string::npos);
}

TEST(ModelLab, KillReleasesWithoutWaitingForAcks) {
  auto lab = lab_of({{"a", "ib"}});
  Node n = Node::on(*lab, "a");
  auto qp = n.qp();
  lab->inject_async_event("a", AsyncEventType::QP_FATAL, qp->qp_num(), 0);
  auto ev = n.ctx->get_async_event(lab->runtime().now_ns() + kNsPerMs);
  ASSERT_TRUE(ev.has_value());  // read, never acked
  const TimeNs t0 = lab->runtime().now_ns();
  n.proc->kill();
  EXPECT_EQ(lab->runtime().now_ns(), t0);
  EXPECT_TRUE(qp->destroyed());
  EXPECT_TRUE(n.ctx->destroyed());
  EXPECT_EQ(lab->fault_counts()["kill"], 1u);
  EXPECT_NO_THROW(n.proc->kill());  // idempotent
  EXPECT_EQ(lab->fault_counts()["kill"], 1u);
  EXPECT_EQ(err_of([&] { n.ctx->alloc_pd(); }), EBADF);
}

TEST(ModelLab, KillWakesAThreadWaitingForEvents) {
  auto lab = lab_of({{"a", "ib"}});
  Node n = Node::on(*lab, "a");
  bool returned = false;
  auto ctx = n.ctx;
  lab->runtime().spawn("events", [&, ctx] {
    auto ev = ctx->get_async_event(SimRuntime::kForever);
    returned = !ev.has_value();
  });
  lab->run_for(kNsPerMs);
  n.proc->kill();
  lab->run_for(kNsPerMs);
  EXPECT_TRUE(returned);
}

TEST(ModelLab, CloseDeviceReleasesWhatIsLeft) {
  auto lab = lab_of({{"a", "ib"}});
  Node n = Node::on(*lab, "a");
  auto qp = n.qp();
  n.ctx->close();
  EXPECT_TRUE(qp->destroyed());
  EXPECT_TRUE(n.pd->destroyed());
  EXPECT_TRUE(n.ctx->destroyed());
  EXPECT_TRUE(n.proc->alive());
  auto again = n.proc->open_device("model-ib0");
  EXPECT_FALSE(again->destroyed());
  EXPECT_EQ(err_of([&] { n.proc->open_device("mlx5_9"); }), ENODEV);
}

TEST(ModelLab, ShutdownIsIdempotentAndEndsEverything) {
  auto lab = lab_of({{"a", "ib"}, {"b", "ib"}});
  Node n = Node::on(*lab, "a");
  auto qp = n.qp();
  bool thread_ended = false;
  auto ctx = n.ctx;
  lab->runtime().spawn("waiter", [&, ctx] {
    ctx->get_async_event(SimRuntime::kForever);
    thread_ended = true;
  });
  lab->run_for(kNsPerMs);
  lab->shutdown();
  EXPECT_TRUE(thread_ended);
  EXPECT_NO_THROW(lab->shutdown());
  EXPECT_TRUE(qp->destroyed());
  EXPECT_EQ(err_of([&] { qp->post_send(SendWr{}); }), EBADF);
  EXPECT_EQ(err_of([&] { n.proc->open_device(""); }), EBADF);
  EXPECT_EQ(err_of([&] { lab->run_for(1); }), ESHUTDOWN);
}

TEST(ModelLab, ObjectsOutliveTheLabSafely) {
  std::shared_ptr<Qp> qp;
  std::shared_ptr<Context> ctx;
  {
    auto lab = lab_of({{"a", "ib"}});
    Node n = Node::on(*lab, "a");
    qp = n.qp();
    ctx = n.ctx;
    auto ctx2 = n.ctx;
    lab->runtime().spawn("waiter", [ctx2] { ctx2->get_async_event(SimRuntime::kForever); });
    lab->run_for(kNsPerUs);
  }  // the destructor shuts the runtime down and joins the harness thread
  EXPECT_TRUE(qp->destroyed());
  EXPECT_EQ(err_of([&] { qp->destroy(0); }), EBADF);
  EXPECT_EQ(err_of([&] { ctx->alloc_pd(); }), EBADF);
}

TEST(ModelLab, DumpStateListsLiveObjects) {
  auto lab = lab_of({{"a", "ib"}});
  Node n = Node::on(*lab, "a");
  auto qp = n.qp();
  const std::string dump = lab->dump_state();
  EXPECT_NE(dump.find("host a"), std::string::npos) << dump;
  EXPECT_NE(dump.find(qp->label() + " qpn 256 RC RESET"), std::string::npos) << dump;
  EXPECT_NE(dump.find("proc:p@a"), std::string::npos) << dump;
}

TEST(ModelLab, AtFiresAFaultAtAVirtualTime) {
  auto lab = lab_of({{"a", "ib"}});
  Node n = Node::on(*lab, "a");
  lab->at(5 * kNsPerMs, [&] { lab->set_port_state("a", false); });
  auto ev = n.ctx->get_async_event(kNsPerSec);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->type, AsyncEventType::PORT_ERR);
  EXPECT_EQ(lab->runtime().now_ns(), 5 * kNsPerMs + 1 * kNsPerUs);  // plus the driver delay
}

TEST(ModelLab, AFailingTimedFaultIsRecordedNotThrown) {
  auto lab = lab_of({{"a", "ib"}});
  lab->at(kNsPerMs, [&] { lab->inject_async_event("a", AsyncEventType::QP_FATAL, 999, 0); });
  EXPECT_NO_THROW(lab->run_for(2 * kNsPerMs));
  EXPECT_EQ(count_kind(*lab, "at_error"), 1u);
}

TEST(ModelLab, DelayedPacketsAreRecordedAsFaults) {
  auto lab = lab_of({{"a", "ib"}, {"b", "ib"}});
  Node a = Node::on(*lab, "a");
  Node b = Node::on(*lab, "b");
  auto qa = a.qp();
  auto qb = b.qp();
  connect(*qa, *a.ctx, *qb, *b.ctx);
  lab->add_rule({{"action", "delay"}, {"opcode", "SEND_ONLY"}, {"delay_ns", 3 * kNsPerMs}});
  qb->post_recv(recv_wr(1, *b.mr));
  const TimeNs t0 = lab->runtime().now_ns();
  qa->post_send(send_wr(1, *a.mr));
  auto rw = wait_wcs(*lab, *b.cq, 1);
  ASSERT_EQ(rw.size(), 1u);
  EXPECT_GE(lab->runtime().now_ns() - t0, 3 * kNsPerMs);
  EXPECT_EQ(lab->fault_counts()["delay"], 1u);
}

// A negative duration is a caller's mistake, not "no time at all": refused, time unchanged.
TEST(ModelLab, NegativeDurationsAreRefused) {
  auto lab = lab_of({{"a", "ib"}});
  lab->runtime().sleep_for(kNsPerUs);
  const TimeNs t0 = lab->runtime().now_ns();
  EXPECT_EQ(err_of([&] { lab->runtime().sleep_for(-1); }), EINVAL);
  EXPECT_EQ(err_of([&] { lab->run_for(-1); }), EINVAL);
  try {
    lab->run_for(-5);
  } catch (const Error& e) {
    EXPECT_EQ(e.verb(), "run_for");
    EXPECT_EQ(e.detail(), "duration_ns = -5 is negative");
  }
  EXPECT_EQ(lab->runtime().now_ns(), t0);
  lab->run_for(0);
  lab->runtime().sleep_for(0);
  EXPECT_EQ(lab->runtime().now_ns(), t0);
}

// The one error for an object of another context, from every verb that takes one.
TEST(ModelLab, VerbsRefuseObjectsOfAnotherContextByName) {
  auto lab = lab_of({{"a", "ib"}, {"b", "ib"}});
  Node a = Node::on(*lab, "a");
  Node b = Node::on(*lab, "b");
  try {
    b.ctx->reg_mr(*a.pd, 64, ACCESS_LOCAL_WRITE);
    FAIL() << "reg_mr took a PD of another host";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EINVAL);
    EXPECT_EQ(e.verb(), "ibv_reg_mr");
    EXPECT_EQ(e.detail(), "pd " + a.pd->label() + " is of " + a.ctx->label() +
                              " on host a, not of " + b.ctx->label() + " on host b");
  }
}

}  // namespace
}  // namespace model_lab_test
}  // namespace rdmalab::model
