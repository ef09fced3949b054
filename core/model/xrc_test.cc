// XRC (semantics.md D, seed 003): the XRCD shared by path, TGT QP handles, both lifetime rules
// with a process kill, events to every handle.
#include <gtest/gtest.h>

#include "model/test_util.h"

namespace rdmalab::model {
namespace {

using namespace testing;

const std::string kPath = "/var/run/app.xrcd";

struct Xrc {
  std::shared_ptr<ModelLab> lab;
  Node creator, holder, sender;
  std::shared_ptr<Xrcd> cx, hx;
  std::shared_ptr<Srq> csrq, hsrq;
  std::shared_ptr<Qp> tgt, handle, ini;

  // Target host "t" (creator and holder processes), sender host "s".
  static Xrc make(const std::string& pers, bool holder_opens_qp) {
    Xrc x;
    x.lab = lab_of({{"t", pers}, {"s", pers}});
    x.creator = Node::on(*x.lab, "t", "creator");
    x.holder = Node::on(*x.lab, "t", "holder");
    x.sender = Node::on(*x.lab, "s", "sender");
    x.cx = x.creator.ctx->open_xrcd(kPath, true, false);
    x.csrq = x.creator.ctx->create_srq_xrc(*x.creator.pd, *x.cx, *x.creator.cq, SrqInitAttr{});
    QpInitAttr ta;
    ta.qp_type = QpType::XRC_RECV;
    ta.xrcd = x.cx;
    x.tgt = x.creator.ctx->create_qp(ta);
    x.hx = x.holder.ctx->open_xrcd(kPath, false, false);
    x.hsrq = x.holder.ctx->create_srq_xrc(*x.holder.pd, *x.hx, *x.holder.cq, SrqInitAttr{});
    if (holder_opens_qp) x.handle = x.holder.ctx->open_qp(*x.hx, x.tgt->qp_num());
    QpInitAttr ia;
    ia.qp_type = QpType::XRC_SEND;
    ia.pd = x.sender.pd;
    ia.send_cq = x.sender.cq;
    x.ini = x.sender.ctx->create_qp(ia);
    RcParams rp;
    rp.timeout = 8;
    rp.retry_cnt = 2;
    to_init(*x.tgt, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE);
    to_init(*x.ini, ACCESS_LOCAL_WRITE);
    to_rtr(*x.tgt, x.sender.ctx->query_gid(1, 0), x.ini->qp_num(), rp);
    to_rtr(*x.ini, x.creator.ctx->query_gid(1, 0), x.tgt->qp_num(), rp, true);
    to_rts(*x.ini, rp);
    return x;
  }

  WorkCompletion send_to(const Srq& srq, uint64_t wr_id) {
    SendWr w = send_wr(wr_id, *sender.mr, 8);
    w.remote_srqn = srq.srq_num();
    ini->post_send(w);
    auto wcs = wait_wcs(*lab, *sender.cq, 1, kNsPerSec);
    EXPECT_EQ(wcs.size(), 1u);
    return wcs.empty() ? WorkCompletion{} : wcs[0];
  }
};

TEST(Xrc, SendReachesTheSrqNamedByRemoteSrqn) {
  Xrc x = Xrc::make("ib", true);
  x.hsrq->post_recv(recv_wr(77, *x.holder.mr));
  x.sender.mr->write(0, bytes("xrc-data"));
  EXPECT_EQ(x.send_to(*x.hsrq, 1).status, WcStatus::SUCCESS);
  auto rw = wait_wcs(*x.lab, *x.holder.cq, 1);
  ASSERT_EQ(rw.size(), 1u);
  EXPECT_EQ(rw[0].wr_id, 77u);
  EXPECT_EQ(rw[0].qp_num, x.tgt->qp_num());
  EXPECT_EQ(x.holder.mr->read(0, 8), bytes("xrc-data"));
  EXPECT_TRUE(x.handle->is_open_handle());
  EXPECT_FALSE(x.tgt->is_open_handle());
  EXPECT_EQ(x.handle->qp_num(), x.tgt->qp_num());
  EXPECT_NE(x.handle->id(), x.tgt->id());
}

TEST(Xrc, UnknownSrqnIsRemInvReqErr) {
  Xrc x = Xrc::make("ib", true);
  SendWr w = send_wr(1, *x.sender.mr, 8);
  w.remote_srqn = 4242;
  x.ini->post_send(w);
  auto wcs = wait_wcs(*x.lab, *x.sender.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::REM_INV_REQ_ERR);
}

TEST(Xrc, OpenXrcdFollowsOpenFlags) {
  auto lab = lab_of({{"t", "ib"}});
  Node a = Node::on(*lab, "t", "a");
  Node b = Node::on(*lab, "t", "b");
  EXPECT_EQ(err_of([&] { a.ctx->open_xrcd("/nope", false, false); }), ENOENT);
  auto x1 = a.ctx->open_xrcd("/x", true, true);
  EXPECT_EQ(err_of([&] { b.ctx->open_xrcd("/x", true, true); }), EEXIST);
  auto x2 = b.ctx->open_xrcd("/x", true, false);
  auto anon1 = a.ctx->open_xrcd("", false, false);  // fd -1: a private domain
  QpInitAttr ta;
  ta.qp_type = QpType::XRC_RECV;
  ta.xrcd = x1;
  auto tgt = a.ctx->create_qp(ta);
  auto handle = b.ctx->open_qp(*x2, tgt->qp_num());  // same domain through the path
  auto anon2 = b.ctx->open_xrcd("", false, false);
  EXPECT_EQ(err_of([&] { b.ctx->open_qp(*anon2, tgt->qp_num()); }), EINVAL);
  EXPECT_EQ(err_of([&] { x1->close(); }), EBUSY);  // the creator's TGT QP uses it
  EXPECT_EQ(err_of([&] { x2->close(); }), EBUSY);  // b's open handle uses it
  handle->destroy(lab->runtime().now_ns());
  x2->close();
  EXPECT_EQ(err_of([&] { x2->close(); }), EBADF);
}

TEST(Xrc, TgtQpEventsGoToEveryOpenHandle) {
  Xrc x = Xrc::make("ib", true);
  x.lab->inject_async_event("t", AsyncEventType::QP_FATAL, x.tgt->qp_num(), 0);
  auto ce = read_events(*x.lab, *x.creator.ctx);
  auto he = read_events(*x.lab, *x.holder.ctx);
  ASSERT_EQ(ce.size(), 1u);
  ASSERT_EQ(he.size(), 1u);
  EXPECT_EQ(ce[0].object_id, x.tgt->id());
  EXPECT_EQ(he[0].object_id, x.handle->id());
  EXPECT_EQ(ce[0].qp_num, he[0].qp_num);
}

// Today's rule: the holder's handle keeps the TGT QP alive after the creator dies (seed 003);
// once the last handle goes the QPN answers no more.
TEST(Xrc, HandleRuleTgtQpOutlivesItsCreatorWhileAHandleIsOpen) {
  Xrc x = Xrc::make("ib", true);
  x.creator.proc->kill();
  EXPECT_TRUE(x.tgt->destroyed());
  EXPECT_EQ(err_of([&] { x.tgt->modify(QpAttr{}, 0); }), EBADF);
  EXPECT_FALSE(x.handle->destroyed());
  x.hsrq->post_recv(recv_wr(5, *x.holder.mr));
  EXPECT_EQ(x.send_to(*x.hsrq, 1).status, WcStatus::SUCCESS);
  EXPECT_EQ(wait_wcs(*x.lab, *x.holder.cq, 1).size(), 1u);
  x.handle->destroy(x.lab->runtime().now_ns());
  EXPECT_EQ(x.send_to(*x.hsrq, 2).status, WcStatus::RETRY_EXC_ERR);
}

TEST(Xrc, HandleRuleHoldingOnlyTheXrcdDoesNotKeepTheTgtQp) {
  Xrc x = Xrc::make("ib", false);
  x.creator.proc->kill();
  x.hsrq->post_recv(recv_wr(5, *x.holder.mr));
  EXPECT_EQ(x.send_to(*x.hsrq, 1).status, WcStatus::RETRY_EXC_ERR);
  bool recorded = false;
  for (const auto& r : x.lab->history().snapshot()) recorded |= r.kind == "tgt_qp_destroyed";
  EXPECT_TRUE(recorded);
}

TEST(Xrc, XrcdRuleTgtQpLivesUntilTheXrcdsLastReference) {
  Xrc x = Xrc::make("ib-legacy", false);
  x.creator.proc->kill();
  x.hsrq->post_recv(recv_wr(5, *x.holder.mr));
  EXPECT_EQ(x.send_to(*x.hsrq, 1).status, WcStatus::SUCCESS);  // the holder's XRCD keeps it
  x.holder.proc->kill();                                       // the last reference
  auto fresh = Node::on(*x.lab, "t", "late");
  EXPECT_EQ(err_of([&] { fresh.ctx->open_xrcd(kPath, false, false); }), ENOENT);
  SendWr w = send_wr(2, *x.sender.mr, 8);
  w.remote_srqn = 1;
  x.ini->post_send(w);
  auto wcs = wait_wcs(*x.lab, *x.sender.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::RETRY_EXC_ERR);
}

TEST(Xrc, LifetimeOverrideFromHostSpec) {
  LabOptions o;
  o.hosts = {HostSpec{"t", "ib", XrcTgtLifetime::kXrcd}};
  auto lab = make_lab(o);
  EXPECT_EQ(lab->host("t")->device_caps("").xrc_tgt_lifetime, XrcTgtLifetime::kXrcd);
}

TEST(Xrc, KillRecordsEveryObjectAndLaterUseIsEbadfOwnerKilled) {
  Xrc x = Xrc::make("ib", true);
  x.creator.proc->kill();
  EXPECT_FALSE(x.creator.proc->alive());
  try {
    x.creator.pd->dealloc();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EBADF);
    EXPECT_NE(e.detail().find("owner process killed"), std::string::npos);
  }
  std::vector<std::string> order;
  size_t kills = 0;
  for (const auto& r : x.lab->history().snapshot()) {
    if (r.kind == "fault" && r.data["fault"] == "kill") ++kills;
    if (r.kind == "destroyed_by_kill") order.push_back(r.object.substr(0, r.object.find(':')));
  }
  EXPECT_EQ(kills, 1u);
  EXPECT_EQ(order, (std::vector<std::string>{"qp", "srq", "cq", "mr", "pd", "xrcd", "ctx"}));
  EXPECT_EQ(err_of([&] { x.creator.proc->open_device(""); }), ESRCH);
}

}  // namespace
}  // namespace rdmalab::model
