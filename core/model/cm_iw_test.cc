// The iWARP CM under rdma_cm (semantics.md F): MPA connect, graceful close with FINs, connect
// errors, the QP's peer from the connection, and destroy with events still queued.
#include <gtest/gtest.h>

#include "model/cm_iw.h"
#include "model/cm_rdma.h"
#include "model/cm_test_util.h"
#include "model/personality.h"

namespace rdmalab::model {
namespace cm_iw_test {  // its own: the tests compile in batches
namespace {

using namespace testing;
using E = CmEventType;

// The wire-fault rule that drops the iWARP CM's segments of this kind (every one, or the first
// count).
nlohmann::json drop_opcode(const std::string& opcode, int count = -1) {
  nlohmann::json rule = {{"action", "drop"}, {"opcode", opcode}};
  if (count > 0) rule["count"] = count;
  return rule;
}

// The provider's MPA reply timeout (Personality::iw_mpa_reply_timeout_ms).
int64_t mpa_reply_ms(const std::string& pers) {
  return personality(pers).iw_mpa_reply_timeout_ms;
}

// Longer than any iWARP timer of the model (cxgb4's 60 s ep timer, rounded on the wheel).
constexpr TimeNs kPastTimers = 120 * kNsPerSec;

// server (on "a") listens, client connects to it, server accepts: ESTABLISHED on both.
void establish(CmEnd& server, CmEnd& client) {
  SCOPED_TRACE("establish");
  server.listen();
  client.start_connect("a");
  server.accept_next();
  EXPECT_EQ(server.next().event, E::ESTABLISHED);
  EXPECT_EQ(client.next().event, E::ESTABLISHED);
}

class IwPers : public ::testing::TestWithParam<std::string> {};

// MPA request/reply; a graceful close: FIN, FIN, ACK; DISCONNECTED on both sides with the QP
// in ERR by then; never TIMEWAIT_EXIT.
TEST_P(IwPers, ConnectSendAndDisconnect) {
  auto lab = lab_of({{"a", GetParam()}, {"b", GetParam()}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  client.start_connect("a");
  const TimeNs t0 = lab->runtime().now_ns();
  EXPECT_EQ(client.id->protocol_state(), "CONN_SENT");
  server.accept_next();
  server.expect(E::ESTABLISHED, 0, t0 + kLatency);  // the provider's ESTABLISHED after its reply
  client.expect(E::ESTABLISHED, 0, t0 + 2 * kLatency);
  EXPECT_EQ(client.id->protocol_state(), "ESTABLISHED");
  auto cq = client.id->qp();
  auto sq = server.id->qp();
  EXPECT_EQ(cq->state(), QpState::RTS);
  EXPECT_EQ(sq->state(), QpState::RTS);
  EXPECT_EQ(cq->query().dest_qp_num, sq->qp_num());  // the peer came from the connection
  EXPECT_EQ(sq->query().dest_qp_num, cq->qp_num());
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "MPA_REQUEST"), 1u);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "MPA_REPLY"), 1u);

  // Data flows over the connection the CM made.
  auto smr = server.id->context()->reg_mr(*server.pd, 4096, ACCESS_LOCAL_WRITE);
  auto cmr = client.id->context()->reg_mr(*client.pd, 4096, ACCESS_LOCAL_WRITE);
  sq->post_recv(recv_wr(1, *smr));
  cq->post_send(send_wr(2, *cmr));
  auto wcs = wait_wcs(*lab, *server.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::SUCCESS);
  ASSERT_EQ(wait_wcs(*lab, *client.cq, 1).size(), 1u);  // the SQ is empty again

  const TimeNs t1 = lab->runtime().now_ns();
  client.id->disconnect();
  EXPECT_EQ(client.id->protocol_state(), "CLOSING");
  EXPECT_EQ(cq->state(), QpState::SQD);                  // graceful: SQD is the RDMAC CLOSING state
  const bool siw = GetParam() == "iwarp-siw";
  if (siw) {  // siw_qp_cm_drop(qp, 0): CLOSE(0) at once, the QP left in CLOSING (Q5)
    client.expect(E::DISCONNECTED, 0, t1);
    EXPECT_EQ(cq->state(), QpState::SQD);
  } else {
    client.expect(E::DISCONNECTED, 0, t1 + 2 * kLatency);  // their FIN, our ACK
    EXPECT_EQ(cq->state(), QpState::ERR);
  }
  // siw PEER_CLOSE: DISCONNECT and CLOSE when the FIN arrives; cxgb4: our ACK of its FIN.
  server.expect(E::DISCONNECTED, 0, t1 + (siw ? 1 : 3) * kLatency);
  EXPECT_EQ(sq->state(), QpState::ERR);
  lab->run_for(kNsPerMs);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "TCP_FIN"), 2u);
  EXPECT_EQ(client.id->protocol_state(), "IDLE");
  EXPECT_TRUE(client.quiet(10 * kNsPerSec));  // no TIMEWAIT_EXIT on iWARP
  EXPECT_TRUE(server.quiet(kNsPerSec));
  client.id->destroy(lab->runtime().now_ns());
  server.id->destroy(lab->runtime().now_ns());
}

// Destroying an established id resets the connection: the peer's DISCONNECTED carries the
// provider's status: cxgb4 peer_abort -> close_complete_upcall(ep, -ECONNRESET); siw
// SIW_CM_WORK_PEER_CLOSE -> IW_CM_EVENT_CLOSE(0), passed through by cma_iw_handler (seen on
// siw in the VM lab: DISCONNECTED status 0 after the peer's process was killed).
TEST_P(IwPers, PeerResetDisconnectsWithTheProvidersStatus) {
  auto lab = lab_of({{"a", GetParam()}, {"b", GetParam()}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  establish(server, client);
  const TimeNs t0 = lab->runtime().now_ns();
  client.id->destroy(t0);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "TCP_RST"), 1u);
  server.expect(E::DISCONNECTED, GetParam() == "iwarp-siw" ? 0 : -ECONNRESET, t0 + kLatency);
  EXPECT_EQ(server.id->qp()->state(), QpState::ERR);
}

// The iw_cm state changes of host's ids, "FROM->TO", in order.
std::vector<std::string> iw_transitions(ModelLab& lab, const std::string& host) {
  std::vector<std::string> out;
  for (const auto& r : lab.history().snapshot()) {
    if (r.host == host && r.kind == "cm_state" && r.data.value("layer", "") == "iw_cm") {
      out.push_back(r.data["from"].get<std::string>() + "->" + r.data["to"].get<std::string>());
    }
  }
  return out;
}

// rdma_destroy_id while the MPA request is unanswered: iwcm.c destroy_cm_id waits on
// connect_wait until the provider's MPA timer (siw 10 s, cxgb4 60 s) ends the connect
// (CONNECT_REPLY -ETIMEDOUT: IDLE), past the caller's deadline, then IDLE -> DESTROYING; the
// user sees no event.
TEST_P(IwPers, DestroyWhileConnSentWaitsForTheMpaTimeout) {
  auto lab = lab_of({{"a", GetParam()}, {"b", GetParam()}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  client.start_connect("a");
  const TimeNs t0 = lab->runtime().now_ns();  // the MPA request went out, its timer armed
  EXPECT_EQ(server.next().event, E::CONNECT_REQUEST);  // never accepted
  client.id->destroy(lab->runtime().now_ns() + kNsPerSec);
  EXPECT_EQ(lab->runtime().now_ns(), fires(t0, mpa_reply_ms(GetParam())));
  EXPECT_TRUE(client.id->destroyed());
  EXPECT_EQ(iw_transitions(*lab, "b"),
            (std::vector<std::string>{"IDLE->CONN_SENT", "CONN_SENT->IDLE", "IDLE->DESTROYING"}));
  EXPECT_EQ(count_records(*lab, "cm_destroy_wait", "state", "CONN_SENT"), 1u);
  EXPECT_EQ(count_kind(*lab, "hung"), 0u);
  EXPECT_TRUE(client.quiet(kNsPerSec));
}

// rdma_destroy_id while the MPA reply is on the wire: destroy returns when it arrives
// (CONN_SENT -> ESTABLISHED), then aborts the connection it made (ESTABLISHED -> DESTROYING,
// QP to ERR, RST): the passive side sees ESTABLISHED, then DISCONNECTED.
TEST_P(IwPers, DestroyWhileConnSentWaitsForTheMpaReply) {
  auto lab = lab_of({{"a", GetParam()}, {"b", GetParam()}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  client.start_connect("a");
  server.accept_next();  // its MPA reply reaches b one latency from now
  const TimeNs t1 = lab->runtime().now_ns();
  EXPECT_EQ(client.id->protocol_state(), "CONN_SENT");
  client.id->destroy(t1);  // a deadline already reached: the kernel waits regardless
  EXPECT_EQ(lab->runtime().now_ns(), t1 + kLatency);
  EXPECT_EQ(iw_transitions(*lab, "b"), (std::vector<std::string>{
                                           "IDLE->CONN_SENT", "CONN_SENT->ESTABLISHED",
                                           "ESTABLISHED->DESTROYING"}));
  EXPECT_EQ(client.id->qp()->state(), QpState::ERR);
  EXPECT_EQ(count_records(*lab, "cm_event_ignored", "iw_event", "CONNECT_REPLY"), 1u);
  server.expect(E::ESTABLISHED, 0, t1 + kLatency);  // queued at t1, read now
  server.expect(E::DISCONNECTED, GetParam() == "iwarp-siw" ? 0 : -ECONNRESET, t1 + 2 * kLatency);
  EXPECT_TRUE(client.quiet(kNsPerSec));
}

// A kill cannot block in the model (it runs inline): the destroy of a connecting id is left
// pending and ends with the same states when the CONNECT_REPLY comes.
TEST_P(IwPers, KillWhileConnSentEndsTheDestroyAtTheReply) {
  auto lab = lab_of({{"a", GetParam()}, {"b", GetParam()}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  client.start_connect("a");
  server.accept_next();
  const TimeNs t1 = lab->runtime().now_ns();
  client.proc->kill();
  EXPECT_EQ(lab->runtime().now_ns(), t1);
  EXPECT_EQ(count_records(*lab, "cm_destroy_deferred", "state", "CONN_SENT"), 1u);
  server.expect(E::ESTABLISHED, 0, t1);
  server.expect(E::DISCONNECTED, GetParam() == "iwarp-siw" ? 0 : -ECONNRESET, t1 + 2 * kLatency);
  EXPECT_EQ(iw_transitions(*lab, "b"), (std::vector<std::string>{
                                           "IDLE->CONN_SENT", "CONN_SENT->ESTABLISHED",
                                           "ESTABLISHED->DESTROYING"}));
}

// No MPA reply ever comes (the request reached a listener that never accepts): the provider's
// MPA timer ends the connect, UNREACHABLE(-ETIMEDOUT): siw MPAREQ_TIMEOUT (HZ * 10) in
// SIW_EPSTATE_AWAIT_MPAREP, cxgb4 ep_timeout_secs (60 s) from send_mpa_req.
TEST_P(IwPers, UnansweredMpaRequestIsUnreachableAtTheProvidersTimeout) {
  auto lab = lab_of({{"a", GetParam()}, {"b", GetParam()}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  client.start_connect("a");
  const TimeNs t0 = lab->runtime().now_ns();  // the MPA request went out, its timer armed
  EXPECT_EQ(server.next().event, E::CONNECT_REQUEST);  // never accepted
  client.expect(E::UNREACHABLE, -ETIMEDOUT, fires(t0, mpa_reply_ms(GetParam())), kPastTimers);
}

// rdma_disconnect while the MPA reply is on the wire: iw_cm_disconnect waits on connect_wait
// until it arrives (CONN_SENT -> ESTABLISHED), then closes what it made (ESTABLISHED ->
// CLOSING, the QP to SQD, a FIN): the user reads ESTABLISHED, then DISCONNECTED.
TEST_P(IwPers, DisconnectWhileConnSentWaitsForTheMpaReply) {
  auto lab = lab_of({{"a", GetParam()}, {"b", GetParam()}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  client.start_connect("a");
  server.accept_next();  // its MPA reply reaches b one latency from now
  const TimeNs t1 = lab->runtime().now_ns();
  EXPECT_EQ(client.id->protocol_state(), "CONN_SENT");
  client.id->disconnect();  // 6.1 returned EINVAL here in the model; iwcm.c waits
  EXPECT_EQ(lab->runtime().now_ns(), t1 + kLatency);
  EXPECT_EQ(count_records(*lab, "cm_disconnect_wait", "state", "CONN_SENT"), 1u);
  EXPECT_EQ(iw_transitions(*lab, "b"), (std::vector<std::string>{
                                           "IDLE->CONN_SENT", "CONN_SENT->ESTABLISHED",
                                           "ESTABLISHED->CLOSING"}));
  EXPECT_EQ(client.next().event, E::ESTABLISHED);
  EXPECT_EQ(client.next().event, E::DISCONNECTED);
  EXPECT_EQ(server.next().event, E::ESTABLISHED);
  EXPECT_EQ(server.next().event, E::DISCONNECTED);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "TCP_FIN"), 2u);
  EXPECT_EQ(count_kind(*lab, "hung"), 0u);
}

// rdma_disconnect while the MPA request is unanswered: the wait lasts until the provider's MPA
// timer ends the connect (CONN_SENT -> IDLE); in IDLE iw_cm_disconnect does nothing and
// returns 0 ("accept or connect returned !0"): no FIN, and the user reads UNREACHABLE.
TEST_P(IwPers, DisconnectWhileConnSentWaitsForTheMpaTimeout) {
  auto lab = lab_of({{"a", GetParam()}, {"b", GetParam()}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  client.start_connect("a");
  const TimeNs t0 = lab->runtime().now_ns();
  EXPECT_EQ(server.next().event, E::CONNECT_REQUEST);  // never accepted
  client.id->disconnect();
  const TimeNs fired = fires(t0, mpa_reply_ms(GetParam()));
  EXPECT_EQ(lab->runtime().now_ns(), fired);
  EXPECT_EQ(iw_transitions(*lab, "b"),
            (std::vector<std::string>{"IDLE->CONN_SENT", "CONN_SENT->IDLE"}));
  client.expect(E::UNREACHABLE, -ETIMEDOUT, fired);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "TCP_FIN"), 0u);
  EXPECT_EQ(count_kind(*lab, "hung"), 0u);
  EXPECT_TRUE(client.quiet(kNsPerSec));
}

// rdma_disconnect on a CONNECT_REQUEST's id before accepting: iw_cm_disconnect in CONN_RECV
// does nothing and returns 0 ("App called disconnect before/without calling accept"); the
// accept still works.
TEST_P(IwPers, DisconnectBeforeAcceptDoesNothing) {
  auto lab = lab_of({{"a", GetParam()}, {"b", GetParam()}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  client.start_connect("a");
  CmEvent req = server.next();
  ASSERT_EQ(req.event, E::CONNECT_REQUEST);
  server.id = server.ch->find_id(req.id);
  server.id->disconnect();
  EXPECT_EQ(server.id->protocol_state(), "CONN_RECV");
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "TCP_FIN"), 0u);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "TCP_RST"), 0u);
  server.make_qp(*server.id);
  server.id->accept(ConnParam{});
  EXPECT_EQ(client.next().event, E::ESTABLISHED);
  EXPECT_EQ(server.next().event, E::ESTABLISHED);
}

// rdma_disconnect on a listener: iw_cm_disconnect in LISTEN is -EINVAL.
TEST_P(IwPers, DisconnectOnAListenerIsEinval) {
  auto lab = lab_of({{"a", GetParam()}, {"b", GetParam()}});
  CmEnd server = CmEnd::on(*lab, "a");
  server.listen();
  EXPECT_EQ(err_of([&] { server.listener->disconnect(); }), EINVAL);
}

INSTANTIATE_TEST_SUITE_P(Cxgb4Siw, IwPers, ::testing::Values("iwarp-cxgb4", "iwarp-siw"));

// The MPA timeouts are the drivers' constants (6.1.192 and 7.2.13): siw_cm.h MPAREQ_TIMEOUT
// (HZ * 10) while the active side awaits the reply, MPAREP_TIMEOUT (HZ * 5) while the passive
// side awaits the request (siw_cm_queue_work); cxgb4 cm.c ep_timeout_secs = 60 for both.
TEST(IwCm, MpaTimeoutsAreTheDrivers) {
  EXPECT_EQ(personality("iwarp-siw").iw_mpa_reply_timeout_ms, 10000u);
  EXPECT_EQ(personality("iwarp-siw").iw_mpa_request_timeout_ms, 5000u);
  EXPECT_EQ(personality("iwarp-cxgb4").iw_mpa_reply_timeout_ms, 60000u);
  EXPECT_EQ(personality("iwarp-cxgb4").iw_mpa_request_timeout_ms, 60000u);
}

// siw, every MPA request lost: the passive side accepted the TCP connection (the SYN) and its
// MPA timer (MPAREP_TIMEOUT, 5 s) runs in SIW_EPSTATE_AWAIT_MPAREQ: the socket is released, a
// FIN; the active side in SIW_EPSTATE_AWAIT_MPAREP takes it as SIW_CM_WORK_PEER_CLOSE:
// CONNECT_REPLY -ECONNRESET, REJECTED, before its own 10 s timer.
TEST(IwCm, SiwLostMpaRequestIsRejectedWhenThePassiveSocketCloses) {
  auto lab = lab_of({{"a", "iwarp-siw"}, {"b", "iwarp-siw"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  lab->add_rule(drop_opcode("MPA_REQUEST"));
  client.start_connect("a");
  const TimeNs syn_at_a = lab->runtime().now_ns() - kLatency;  // the SYN-ACK just arrived
  const int64_t ms = personality("iwarp-siw").iw_mpa_request_timeout_ms;
  client.expect(E::REJECTED, -ECONNRESET, fires(syn_at_a, ms) + kLatency, kPastTimers);
  EXPECT_EQ(count_records(*lab, "cm_timeout", "awaiting", "MPA_REQUEST"), 1u);
  EXPECT_EQ(client.id->protocol_state(), "IDLE");
  EXPECT_TRUE(server.quiet(kPastTimers));  // no CONNECT_REQUEST
  EXPECT_TRUE(client.quiet(kNsPerSec));    // and no UNREACHABLE from the 10 s timer
}

// siw, the listener gone between the TCP connect and the MPA request: b answers the request
// with an RST; a, in SIW_EPSTATE_AWAIT_MPAREP, takes the reset as SIW_CM_WORK_PEER_CLOSE:
// CONNECT_REPLY -ECONNRESET, REJECTED at once (not its 10 s timer).
TEST(IwCm, SiwResetAfterTheTcpConnectIsRejected) {
  auto lab = lab_of({{"a", "iwarp-siw"}, {"b", "iwarp-siw"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  const TimeNs hold = kNsPerMs;
  lab->add_rule({{"action", "delay"}, {"opcode", "MPA_REQUEST"}, {"delay_ns", hold}});
  client.start_connect("a");
  const TimeNs t0 = lab->runtime().now_ns();
  server.listener->destroy(t0 + kNsPerSec);
  client.expect(E::REJECTED, -ECONNRESET, t0 + hold + 2 * kLatency);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "TCP_RST"), 1u);
  EXPECT_TRUE(client.quiet(2 * mpa_reply_ms("iwarp-siw") * kNsPerMs));
}

TEST(IwCm, NoListenerIsRefused) {
  auto lab = lab_of({{"a", "iwarp-cxgb4"}, {"b", "iwarp-cxgb4"}});
  CmEnd client = CmEnd::on(*lab, "b");
  client.start_connect("a", 4242);
  const TimeNs t0 = lab->runtime().now_ns();
  client.expect(E::REJECTED, -ECONNREFUSED, t0 + 2 * kLatency);
  EXPECT_EQ(client.id->qp()->state(), QpState::ERR);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "TCP_RST"), 1u);
}

// siw_connect's blocking connect (Q6): the SYN meets RST, rdma_connect fails ECONNREFUSED
// in the call, no event; the id is back in ROUTE_RESOLVED.
TEST(IwCm, SiwConnectToNoListenerFailsInTheCall) {
  auto lab = lab_of({{"a", "iwarp-siw"}, {"b", "iwarp-siw"}});
  CmEnd client = CmEnd::on(*lab, "b");
  EXPECT_EQ(err_of([&] { client.start_connect("a", 4242); }), ECONNREFUSED);
  EXPECT_EQ(client.id->protocol_state(), "IDLE");  // the iw id was destroyed
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "TCP_SYN"), 1u);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "TCP_RST"), 1u);
  EXPECT_TRUE(client.quiet(kNsPerSec));
}

// Every SYN lost: the caller blocks through tcp_syn_retries retransmissions on the doubling
// RTO, (2^(6+1) - 1) s = 127 s, and rdma_connect fails ETIMEDOUT (6.1 tcp_write_timeout);
// each RTO runs on the timer wheel, so the call returns up to 4.9 s later than 127 s (129.95 s
// measured on siw).
TEST(IwCm, SiwConnectWithEverySynLostTimesOutAfter127s) {
  auto lab = lab_of({{"a", "iwarp-siw"}, {"b", "iwarp-siw"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  lab->add_rule(drop_opcode("TCP_SYN"));
  TimeNs t0 = 0;
  const int err = err_of([&] {
    client.id = client.ch->create_id();
    client.id->resolve_addr("a", kPort, kNsPerSec);
    client.next();
    client.id->resolve_route(kNsPerSec);
    client.next();
    client.make_qp(*client.id);
    t0 = lab->runtime().now_ns();
    client.id->connect(ConnParam{});
  });
  EXPECT_EQ(err, ETIMEDOUT);
  TimeNs expect = t0;
  for (int64_t rto_ms = 1000; rto_ms <= 64000; rto_ms *= 2) expect = fires(expect, rto_ms);
  EXPECT_EQ(lab->runtime().now_ns(), expect);
  EXPECT_GT(expect - t0, 127 * kNsPerSec);
  EXPECT_LE(expect - t0, 127 * kNsPerSec + (2 * 32 + 3 * 256 + 2 * 2048) * kNsPerMs);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "TCP_SYN"), 7u);
  EXPECT_TRUE(server.quiet(kNsPerSec));
}

// An MPA reject is REJECTED with the provider's status: cxgb4's process_mpa_reply sets
// -ECONNREFUSED on MPA_REJECT (connect_reply_upcall(ep, err)); siw_proc_mpareply upcalls
// CONNECT_REPLY with -ECONNRESET (both hw/cxgb4/cm.c and sw/siw/siw_cm.c, Linux 6.1).
TEST_P(IwPers, PeerRejectStatusIsTheProviders) {
  auto lab = lab_of({{"a", GetParam()}, {"b", GetParam()}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  client.start_connect("a");
  const TimeNs t0 = lab->runtime().now_ns();
  CmEvent req = server.next();
  ASSERT_EQ(req.event, E::CONNECT_REQUEST);
  server.ch->find_id(req.id)->reject({});
  const int want = GetParam() == "iwarp-cxgb4" ? -ECONNREFUSED : -ECONNRESET;
  client.expect(E::REJECTED, want, t0 + 2 * kLatency);
  EXPECT_EQ(client.id->protocol_state(), "IDLE");
}

TEST(IwCm, NoAnswerIsUnreachable) {
  auto lab = lab_of({{"a", "iwarp-cxgb4"}, {"b", "iwarp-cxgb4"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  lab->add_rule(drop_opcode("MPA_REQUEST"));
  client.start_connect("a");
  const TimeNs t0 = lab->runtime().now_ns();
  ASSERT_EQ(mpa_reply_ms("iwarp-cxgb4"), 60000);  // cm.c ep_timeout_secs = 60
  client.expect(E::UNREACHABLE, -ETIMEDOUT, fires(t0, 60000), kPastTimers);
  EXPECT_TRUE(server.quiet(kNsPerSec));
}

// A lost FIN on cxgb4: the closing side's ep timer (60 s) fires: QP ERR, DISCONNECTED
// (-ETIMEDOUT, process_timeout), then an abort the peer sees as -ECONNRESET (peer_abort).
TEST(IwCm, LostFinEndsInAReset) {
  auto lab = lab_of({{"a", "iwarp-cxgb4"}, {"b", "iwarp-cxgb4"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  establish(server, client);
  lab->add_rule(drop_opcode("TCP_FIN", 1));
  const TimeNs t1 = lab->runtime().now_ns();
  client.id->disconnect();
  client.expect(E::DISCONNECTED, -ETIMEDOUT, fires(t1, 60000), kPastTimers);
  EXPECT_EQ(client.id->qp()->state(), QpState::ERR);
  server.expect(E::DISCONNECTED, -ECONNRESET, fires(t1, 60000) + kLatency);
  EXPECT_EQ(server.id->qp()->state(), QpState::ERR);
}

// A lost FIN on siw: the closer has DISCONNECTED(0) at once and its QP stays CLOSING; the
// peer hears nothing (Q5).
TEST(IwCm, SiwLostFinClosesAtOnceAndLeavesThePeerHalfOpen) {
  auto lab = lab_of({{"a", "iwarp-siw"}, {"b", "iwarp-siw"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  establish(server, client);
  lab->add_rule(drop_opcode("TCP_FIN"));
  const TimeNs t1 = lab->runtime().now_ns();
  client.id->disconnect();
  client.expect(E::DISCONNECTED, 0, t1);
  EXPECT_EQ(client.id->qp()->state(), QpState::SQD);
  EXPECT_TRUE(server.quiet(kPastTimers));
  EXPECT_EQ(server.id->qp()->state(), QpState::RTS);
}

// siw_proc_send with no RQE (Q7c): the responder TERMINATEs; both QPs ERR, both ids
// DISCONNECTED(0); the sender's SEND completed SUCCESS when handed to TCP (Q4).
TEST(IwCm, SiwSendWithoutReceiveTerminatesBothSides) {
  auto lab = lab_of({{"a", "iwarp-siw"}, {"b", "iwarp-siw"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  establish(server, client);
  auto cmr = client.id->context()->reg_mr(*client.pd, 4096, ACCESS_LOCAL_WRITE);
  const TimeNs t1 = lab->runtime().now_ns();
  client.id->qp()->post_send(send_wr(1, *cmr));
  server.expect(E::DISCONNECTED, 0, t1 + kLatency);
  client.expect(E::DISCONNECTED, 0, t1 + 2 * kLatency);
  EXPECT_EQ(server.id->qp()->state(), QpState::ERR);
  EXPECT_EQ(client.id->qp()->state(), QpState::ERR);
  auto wcs = wait_wcs(*lab, *client.cq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(count_records(*lab, "qp_state", "why", "responder: no receive buffer (iWARP has no RNR)"),
            1u);
  EXPECT_EQ(count_records(*lab, "qp_state", "why", "TERMINATE received (REM_OP_ERR)"), 1u);
}

// seed 000: a graceful close of an iWARP QP with send WRs outstanding is ERR, not CLOSING.
TEST(IwCm, GracefulCloseWithSqWorkIsError) {
  auto lab = lab_of({{"a", "iwarp-cxgb4"}, {"b", "iwarp-cxgb4"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  client.start_connect("a");
  server.accept_next();
  EXPECT_EQ(client.next().event, E::ESTABLISHED);
  auto cmr = client.id->context()->reg_mr(*client.pd, 4096, ACCESS_LOCAL_WRITE);
  lab->add_rule({{"action", "drop"}, {"rdmap_opcode", "SEND"}});  // the SEND is never acknowledged
  client.id->qp()->post_send(send_wr(1, *cmr));
  lab->run_for(kNsPerMs);
  client.id->disconnect();
  EXPECT_EQ(client.id->qp()->state(), QpState::ERR);
  EXPECT_EQ(client.id->protocol_state(), "CLOSING");
}

// Destroy while the peer's DISCONNECT is still on the id's work list: the event is dropped
// (IWCM_F_DROP_EVENTS), destroy does not wait, nothing reaches the channel after it.
TEST(IwCm, DestroyWithQueuedEventsDropsThem) {
  auto lab = lab_of({{"a", "iwarp-cxgb4"}, {"b", "iwarp-cxgb4"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  establish(server, client);
  const TimeNs t1 = lab->runtime().now_ns();
  client.id->disconnect();
  auto conn = std::dynamic_pointer_cast<ModelCmId>(server.id);
  ASSERT_TRUE(conn);
  size_t disconnects_raised = 0;
  std::string state_at_destroy;
  // Runs after the FIN's arrival (scheduled first), before the work item it queued.
  lab->at(t1 + kLatency, [&] {
    disconnects_raised = count_records(*lab, "iw_event", "event", "DISCONNECT");
    state_at_destroy = conn->protocol_state();
    conn->release(Release::kVerb);  // rdma_destroy_id with nothing to ack: it does not block
  });
  client.expect(E::DISCONNECTED, 0, t1 + 2 * kLatency);
  EXPECT_EQ(disconnects_raised, 1u);
  EXPECT_EQ(state_at_destroy, "ESTABLISHED");  // the DISCONNECT was still queued
  EXPECT_EQ(count_records(*lab, "iw_event_dropped", "event", "DISCONNECT"), 1u);
  EXPECT_TRUE(server.id->destroyed());
  EXPECT_TRUE(server.quiet(kPastTimers));
  EXPECT_TRUE(client.quiet(kNsPerSec));
}

TEST(IwCm, DumpShowsIwState) {
  auto lab = lab_of({{"a", "iwarp-siw"}, {"b", "iwarp-siw"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  client.start_connect("a");
  server.accept_next();
  EXPECT_EQ(client.next().event, E::ESTABLISHED);
  const std::string d = lab->dump_state();
  EXPECT_NE(d.find(client.id->label() + " rdma_cm CONNECT iw_cm ESTABLISHED"), std::string::npos)
      << d;
  EXPECT_NE(d.find("iw_cm:"), std::string::npos) << d;
}

}  // namespace
}  // namespace cm_iw_test
}  // namespace rdmalab::model
