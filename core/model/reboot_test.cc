// ModelLab::reboot: a host crash with nothing sent, the host back with the same GUID and first
// QPN, and the stale-connection exchange that follows (semantics.md A and B, vmlab.md on rxe).
#include <gtest/gtest.h>

#include "model/cm_test_util.h"

namespace rdmalab::model {
namespace {

using namespace testing;
using E = CmEventType;

TEST(Reboot, HostLosesEverythingAndComesBack) {
  auto lab = lab_of({{"a", "roce"}, {"b", "roce"}});
  Node n = Node::on(*lab, "b");
  auto q1 = n.qp();
  auto q2 = n.qp();
  EXPECT_EQ(q2->qp_num(), 18u);
  const uint64_t guid = lab->host("b")->device_caps("").node_guid;
  const TimeNs t0 = lab->runtime().now_ns();
  lab->reboot("b", 2 * kNsPerSec);
  EXPECT_FALSE(n.proc->alive());
  EXPECT_TRUE(q1->destroyed());
  EXPECT_EQ(err_of([&] { q1->post_recv(recv_wr(1, *n.mr)); }), EBADF);
  EXPECT_EQ(err_of([&] { lab->host("b")->create_process("early"); }), EHOSTDOWN);
  EXPECT_EQ(err_of([&] { lab->reboot("b", 1); }), EALREADY);
  EXPECT_EQ(count_records(*lab, "fault", "fault", "reboot"), 1u);
  EXPECT_EQ(lab->fault_counts().at("reboot"), 1u);
  EXPECT_EQ(lab->fault_counts().count("kill"), 0u);  // a crash, not a kill
  lab->run_until(t0 + 2 * kNsPerSec);
  EXPECT_EQ(count_kind(*lab, "host_up"), 1u);
  Node m = Node::on(*lab, "b", "after");
  EXPECT_EQ(m.qp()->qp_num(), 17u);  // the allocator starts again
  EXPECT_EQ(lab->host("b")->device_caps("").node_guid, guid);
}

TEST(Reboot, PacketsToADownHostAreLost) {
  auto lab = lab_of({{"a", "ib"}, {"b", "ib"}});
  Node a = Node::on(*lab, "a");
  Node b = Node::on(*lab, "b");
  auto qa = a.qp();
  auto qb = b.qp();
  connect(*qa, *a.ctx, *qb, *b.ctx);
  lab->reboot("b", kNsPerSec);
  qa->post_send(send_wr(1, *a.mr));
  lab->run_for(kNsPerMs);
  EXPECT_GE(count_records(*lab, "fault", "fault", "host_down_drop"), 1u);
}

// The survivor (a) holds an ESTABLISHED connection to (QPN 17, GUID of b). b reboots and
// connects again from QPN 17: its REQ is REJECTED(10) as stale, a's old id sends a DREQ for
// QPN 17, b answers it with a DREP for an unknown connection, a's old id gets DISCONNECTED(0)
// and later TIMEWAIT_EXIT; b's retry (QPN 18) connects. No CM message left b at the crash.
TEST(Reboot, ReconnectWithTheSameQpnIsStale) {
  auto lab = lab_of({{"a", "roce"}, {"b", "roce"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  connect_pair(server, client, "a");
  ASSERT_EQ(client.id->qp()->qp_num(), 17u);
  auto old_conn = server.id;
  const size_t sends_before = lab->history().size();
  lab->reboot("b", kNsPerSec);
  for (const auto& r : lab->history().since(sends_before)) EXPECT_NE(r.kind, "cm_send");
  lab->run_for(kNsPerSec);

  CmEnd back = CmEnd::on(*lab, "b", "again");
  back.start_connect("a");
  ASSERT_EQ(back.id->qp()->qp_num(), 17u);
  const TimeNs t2 = lab->runtime().now_ns();
  back.expect(E::REJECTED, REJ_STALE_CONN, t2 + 2 * kLatency);
  EXPECT_EQ(back.id->protocol_state(), "TIMEWAIT");  // cm_rej_handler: STALE_CONN -> TIMEWAIT
  EXPECT_EQ(back.id->qp()->state(), QpState::ERR);
  server.expect(E::DISCONNECTED, 0, t2 + 3 * kLatency);
  EXPECT_EQ(old_conn->protocol_state(), "TIMEWAIT");
  EXPECT_EQ(count_kind(*lab, "cm_stale"), 1u);
  bool dreq_for_17 = false;
  for (const auto& r : lab->history().snapshot()) {
    if (r.kind == "cm_send" && r.data["msg"] == "DREQ" && r.host == "a")
      dreq_for_17 = r.data["qpn"] == 17;
  }
  EXPECT_TRUE(dreq_for_17);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "DREP"), 1u);  // b's cm_issue_drep
  server.expect(E::TIMEWAIT_EXIT, 0, fires(t2 + 3 * kLatency, 2048));
  EXPECT_TRUE(back.quiet(2 * kNsPerSec));  // REJECTED: no TIMEWAIT_EXIT

  back.id->destroy(lab->runtime().now_ns());
  old_conn->destroy(lab->runtime().now_ns());
  back.start_connect("a");
  EXPECT_EQ(back.id->qp()->qp_num(), 18u);
  const TimeNs t3 = lab->runtime().now_ns();
  server.accept_next();
  back.expect(E::ESTABLISHED, 0, t3 + 2 * kLatency);
  server.expect(E::ESTABLISHED, 0, t3 + 3 * kLatency);
}

// A host that is down answers nothing: a REQ to it ends in UNREACHABLE(-ETIMEDOUT).
TEST(Reboot, ConnectToADownHostIsUnreachable) {
  auto lab = lab_of({{"a", "ib"}, {"b", "ib"}});
  CmEnd client = CmEnd::on(*lab, "b");
  lab->reboot("a", 1000 * kNsPerSec);
  client.start_connect("a");
  const TimeNs t0 = lab->runtime().now_ns();
  client.expect(E::UNREACHABLE, -ETIMEDOUT, fires_n(t0, 6144, 16));
  EXPECT_EQ(count_records(*lab, "fault", "fault", "host_down_drop"), 16u);
}

}  // namespace
}  // namespace rdmalab::model
