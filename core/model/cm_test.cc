// The IB CM under rdma_cm on the model: connect and disconnect, lost DREP/REP/RTU, REQ to no
// listener, MRA, REQ timeout, destroy and acks, with exact virtual times from cm.c's formulas.
//
// Defaults (CmTiming, Linux 6.1 cma.c): packet_life_time 18, cm_response_timeout 20,
// max_cm_retries 15.
//   active timeout_ms  = 2 * cm_convert_to_ms(18) + cm_convert_to_ms(20) = 2*1024 + 4096 = 6144
//   passive timeout_ms = cm_convert_to_ms(REQ.local_cm_response_timeout = 20) = 4096
//   TIMEWAIT = cm_convert_to_ms(cm_ack_timeout(ack_delay, 18)) = 19 -> 2048 ms for ib/mana (16)
//              and roce (rxe 15) alike.
#include <gtest/gtest.h>

#include "model/cm_ib.h"
#include "model/cm_rdma.h"
#include "model/cm_test_util.h"
#include "model/device.h"
#include "model/model_lab.h"

namespace rdmalab::model {
namespace cm_test {  // its own: the tests compile in batches
namespace {

using namespace testing;
using E = CmEventType;

constexpr TimeNs kActiveTimeoutNs = 6144 * kNsPerMs;
constexpr TimeNs kPassiveTimeoutNs = 4096 * kNsPerMs;

TimeNs timewait_ns(const std::string& /*pers*/) {
  return 2048 * kNsPerMs;
}

TEST(CmFormulas, ConvertAndAckTimeout) {
  EXPECT_EQ(cm_convert_to_ms(20), 4096);
  EXPECT_EQ(cm_convert_to_ms(16), 256);
  EXPECT_EQ(cm_convert_to_ms(3), 1);  // 1 << max(t - 8, 0)
  EXPECT_EQ(cm_ack_timeout(16, 16), 18);
  EXPECT_EQ(cm_ack_timeout(15, 16), 17);
  EXPECT_EQ(cm_ack_timeout(20, 16), 20);  // ack delay dominates: 20 + (17 >= 19 ? 1 : 0)
  EXPECT_EQ(cm_ack_timeout(31, 31), 31);
}

class CmPers : public ::testing::TestWithParam<std::string> {};

// REQ, REP, RTU; DREQ, DREP; DISCONNECTED on both sides, TIMEWAIT_EXIT after the TIMEWAIT.
TEST_P(CmPers, ConnectAndDisconnect) {
  const std::string pers = GetParam();
  auto lab = lab_of({{"a", pers}, {"b", pers}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  connect_pair(server, client, "a");
  EXPECT_EQ(client.id->cm_state(), "CONNECT");
  EXPECT_EQ(client.id->protocol_state(), "ESTABLISHED");
  EXPECT_EQ(server.id->protocol_state(), "ESTABLISHED");
  EXPECT_EQ(client.id->qp()->state(), QpState::RTS);
  EXPECT_EQ(server.id->qp()->state(), QpState::RTS);
  EXPECT_EQ(client.id->qp()->query().dest_qp_num, server.id->qp()->qp_num());
  EXPECT_EQ(server.id->qp()->query().dest_qp_num, client.id->qp()->qp_num());
  for (const char* m : {"REQ", "REP", "RTU"})
    EXPECT_EQ(count_records(*lab, "cm_send", "msg", m), 1u) << m;

  const TimeNs t1 = lab->runtime().now_ns();
  client.id->disconnect();
  EXPECT_EQ(client.id->qp()->state(), QpState::ERR);  // rdma_disconnect: QP to ERR first
  server.expect(E::DISCONNECTED, 0, t1 + kLatency);
  EXPECT_EQ(server.id->qp()->state(), QpState::RTS);  // the peer's DREQ does not touch the QP
  EXPECT_EQ(server.id->protocol_state(), "DREQ_RCVD");
  server.id->disconnect();  // answers with the DREP
  EXPECT_EQ(server.id->protocol_state(), "TIMEWAIT");
  client.expect(E::DISCONNECTED, 0, t1 + 2 * kLatency);
  const TimeNs tw = timewait_ns(pers);
  server.expect(E::TIMEWAIT_EXIT, 0, fires(t1 + kLatency, tw / kNsPerMs), 2 * tw);
  client.expect(E::TIMEWAIT_EXIT, 0, fires(t1 + 2 * kLatency, tw / kNsPerMs), 2 * tw);
  EXPECT_EQ(client.id->cm_state(), "DISCONNECT");
  EXPECT_EQ(client.id->protocol_state(), "IDLE");
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "DREQ"), 1u);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "DREP"), 1u);
  client.id->destroy(lab->runtime().now_ns());
  server.id->destroy(lab->runtime().now_ns());
  EXPECT_TRUE(client.quiet(10 * kNsPerSec));
}

INSTANTIATE_TEST_SUITE_P(IbRoceMana, CmPers, ::testing::Values("ib", "roce", "mana"));

// Every DREP lost: the DREQ goes max_cm_retries + 1 times, DISCONNECTED(-ETIMEDOUT) after
// (retries + 1) * timeout_ms, TIMEWAIT_EXIT a TIMEWAIT later; the peer is told at once.
TEST(Cm, EveryDrepDropped) {
  auto lab = lab_of({{"a", "ib"}, {"b", "ib"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  connect_pair(server, client, "a");
  lab->add_rule(drop_mad(0x16));
  const TimeNs t1 = lab->runtime().now_ns();
  client.id->disconnect();
  server.expect(E::DISCONNECTED, 0, t1 + kLatency);
  server.id->disconnect();  // its DREP is lost
  server.expect(E::TIMEWAIT_EXIT, 0, fires(t1 + kLatency, 2048));
  // 16 DREQs: each timeout of 6144 ms runs at the end of a 64-jiffy bucket, 6400 ms after the
  // one before (the first from wherever t1 lies in its bucket).
  const TimeNs gave_up = fires_n(t1, 6144, 16);
  EXPECT_EQ(gave_up - fires(t1, 6144), 15 * 6400 * kNsPerMs);
  client.expect(E::DISCONNECTED, -ETIMEDOUT, gave_up);
  client.expect(E::TIMEWAIT_EXIT, 0, fires(gave_up, 2048));
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "DREQ"), 16u);
  EXPECT_EQ(count_records(*lab, "cm_retry", "msg", "DREQ"), 15u);
  EXPECT_EQ(count_records(*lab, "cm_timeout", "msg", "DREQ"), 1u);
  EXPECT_EQ(count_records(*lab, "fault", "fault", "drop"), 1u);  // the server's one DREP
}

// rdma_set_option timing: fewer retries and shorter timeouts follow the same formulas.
TEST(Cm, TimingKnobsFollowTheFormulas) {
  auto lab = lab_of({{"a", "roce"}, {"b", "roce"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  lab->add_rule(drop_mad(0x10));  // every REQ lost
  CmTiming t;
  t.cm_response_timeout = 18;  // 1024 ms
  t.max_cm_retries = 3;
  t.packet_life_time = 14;  // 64 ms
  client.start_connect("a", kPort, &t);
  const TimeNs t0 = lab->runtime().now_ns();
  client.expect(E::UNREACHABLE, -ETIMEDOUT, fires_n(t0, 2 * 64 + 1024, 4), 10 * kNsPerSec);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "REQ"), 4u);
  EXPECT_EQ(client.id->protocol_state(), "IDLE");
  EXPECT_TRUE(server.quiet(kNsPerSec));
}

TEST(Cm, NoListenerIsRejectedInvalidServiceId) {
  auto lab = lab_of({{"a", "roce"}, {"b", "roce"}});
  CmEnd client = CmEnd::on(*lab, "b");
  client.start_connect("a", 9999);
  const TimeNs t0 = lab->runtime().now_ns();
  client.expect(E::REJECTED, REJ_INVALID_SERVICE_ID, t0 + 2 * kLatency);
  EXPECT_EQ(client.id->qp()->state(), QpState::ERR);  // REJECTED moves the QP to ERR
  EXPECT_EQ(client.id->protocol_state(), "IDLE");
  EXPECT_EQ(client.id->cm_state(), "CONNECT");  // stays in CONNECT: no TIMEWAIT_EXIT after
  EXPECT_TRUE(client.quiet(5 * kNsPerSec));
}

TEST(Cm, RejectIsConsumerDefined) {
  auto lab = lab_of({{"a", "ib"}, {"b", "ib"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  client.start_connect("a");
  const TimeNs t0 = lab->runtime().now_ns();
  CmEvent req = server.next();
  ASSERT_EQ(req.event, E::CONNECT_REQUEST);
  server.ch->find_id(req.id)->reject({});
  client.expect(E::REJECTED, REJ_CONSUMER_DEFINED, t0 + 2 * kLatency);
  EXPECT_EQ(server.ch->find_id(req.id)->protocol_state(), "IDLE");
}

// A lost REP: the passive side resends it after its timeout (4096 ms); a REQ resent meanwhile
// finds the passive id in REP_SENT and is dropped (cm_dup_req_handler).
TEST(Cm, LostRepIsResentByThePassiveSide) {
  auto lab = lab_of({{"a", "ib"}, {"b", "ib"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  lab->add_rule(drop_mad(0x13, 1));
  client.start_connect("a");
  const TimeNs t0 = lab->runtime().now_ns();
  CmEvent req = server.next();
  ASSERT_EQ(req.event, E::CONNECT_REQUEST);
  // A slow accept: the REQ retry (6144 ms) comes before the REP retry (accept + 4096 ms).
  lab->run_for(5 * kNsPerSec / 2);
  server.id = server.ch->find_id(req.id);
  server.make_qp(*server.id);
  server.id->accept(ConnParam{});
  const TimeNs t_rep = lab->runtime().now_ns();
  client.expect(E::ESTABLISHED, 0, fires(t_rep, 4096) + kLatency, 10 * kNsPerSec);
  server.expect(E::ESTABLISHED, 0, fires(t_rep, 4096) + 2 * kLatency);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "REQ"), 2u);
  EXPECT_EQ(count_records(*lab, "cm_duplicate", "msg", "REQ"), 1u);  // dropped in REP_SENT
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "REP"), 2u);
  EXPECT_GT(t_rep + kPassiveTimeoutNs, t0 + kActiveTimeoutNs);
}

// A lost RTU: the passive side stays in REP_SENT and resends the REP; the active side, already
// ESTABLISHED, answers the duplicate REP with an RTU.
TEST(Cm, LostRtuIsRepairedByADuplicateRep) {
  auto lab = lab_of({{"a", "roce"}, {"b", "roce"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  lab->add_rule(drop_mad(0x14, 1));
  client.start_connect("a");
  const TimeNs t0 = lab->runtime().now_ns();
  server.accept_next();
  client.expect(E::ESTABLISHED, 0, t0 + 2 * kLatency);
  EXPECT_EQ(server.id->protocol_state(), "REP_SENT");
  server.expect(E::ESTABLISHED, 0, fires(t0 + kLatency, 4096) + 2 * kLatency, 10 * kNsPerSec);
  EXPECT_EQ(count_records(*lab, "cm_duplicate", "msg", "REP"), 1u);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "RTU"), 2u);
}

// A REQ resent while the consumer has not accepted yet (MRA_REQ_SENT) gets an MRA; the active
// side then waits service_timeout + av.timeout = cm_convert_to_ms(24) + cm_convert_to_ms(17).
TEST(Cm, DuplicateReqBeforeAcceptGetsAnMra) {
  auto lab = lab_of({{"a", "ib"}, {"b", "ib"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  client.start_connect("a");
  const TimeNs t0 = lab->runtime().now_ns();
  CmEvent req = server.next();
  ASSERT_EQ(req.event, E::CONNECT_REQUEST);
  EXPECT_EQ(server.ch->find_id(req.id)->protocol_state(), "MRA_REQ_SENT");
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "MRA"), 0u);  // delayed MRA: not sent yet
  const TimeNs resent = fires(t0, 6144);
  lab->run_until(resent + 2 * kLatency);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "MRA"), 1u);
  EXPECT_EQ(client.id->protocol_state(), "MRA_REQ_RCVD");
  // No more REQs for 65536 + 2048 ms, on the wheel's level 3 (512-jiffy buckets).
  const TimeNs next_req = fires(resent + 2 * kLatency, 67584);
  EXPECT_GT(next_req, resent + 2 * kLatency + 67584 * kNsPerMs);
  lab->run_until(next_req - 1);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "REQ"), 2u);
  lab->run_for(2 * kLatency);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "REQ"), 3u);
  server.id = server.ch->find_id(req.id);
  server.make_qp(*server.id);
  server.id->accept(ConnParam{});
  EXPECT_EQ(client.next(kNsPerSec).event, E::ESTABLISHED);
  EXPECT_EQ(server.next(kNsPerSec).event, E::ESTABLISHED);
}

// rdma_destroy_id waits for the acks of events read for the id; EBUSY at the deadline; no
// event for the id is delivered after it returns.
TEST(Cm, DestroyWaitsForAcksAndNothingAfter) {
  auto lab = lab_of({{"a", "ib"}, {"b", "ib"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  client.start_connect("a");
  server.accept_next();
  auto est = client.next(kNsPerSec, false);  // read, not acked
  ASSERT_EQ(est.event, E::ESTABLISHED);
  const TimeNs now = lab->runtime().now_ns();
  EXPECT_EQ(err_of([&] { client.id->destroy(now + kNsPerMs); }), EBUSY);
  EXPECT_EQ(lab->runtime().now_ns(), now + kNsPerMs);
  client.ch->ack_event(est);
  client.id->destroy(lab->runtime().now_ns());
  EXPECT_TRUE(client.id->destroyed());
  EXPECT_EQ(err_of([&] { client.id->disconnect(); }), EBADF);
  // cm_destroy_id in ESTABLISHED: one DREQ, no retries; the peer gets DISCONNECTED.
  EXPECT_EQ(server.next().event, E::ESTABLISHED);
  EXPECT_EQ(server.next().event, E::DISCONNECTED);
  EXPECT_TRUE(client.quiet(30 * kNsPerSec));
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "DREQ"), 1u);
  EXPECT_EQ(err_of([&] { server.ch->destroy(); }), EBUSY);  // ids remain
}

// Destroying a listener with an unread CONNECT_REQUEST drops the event and rejects the
// connection (cm_destroy_id in MRA_REQ_SENT: REJ CONSUMER_DEFINED).
TEST(Cm, ListenerDestroyDropsUnreadRequests) {
  auto lab = lab_of({{"a", "ib"}, {"b", "ib"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  server.listen();
  client.start_connect("a");
  const TimeNs t0 = lab->runtime().now_ns();
  lab->run_for(10 * kLatency);
  server.listener->destroy(lab->runtime().now_ns());
  EXPECT_EQ(count_kind(*lab, "cm_event_dropped"), 1u);
  client.expect(E::REJECTED, REJ_CONSUMER_DEFINED, t0 + 11 * kLatency);
  EXPECT_TRUE(server.quiet(kNsPerSec));
}

TEST(Cm, AddressErrorsAndStateChecks) {
  auto lab = lab_of({{"a", "ib"}});
  CmEnd c = CmEnd::on(*lab, "a");
  auto id = c.ch->create_id();
  EXPECT_EQ(id->context(), nullptr);
  EXPECT_EQ(err_of([&] { id->connect(ConnParam{}); }), EINVAL);
  id->resolve_addr("nowhere", kPort, kNsPerSec);
  c.expect(E::ADDR_ERROR, -EHOSTUNREACH, kCmResolveNs);
  EXPECT_EQ(id->cm_state(), "ADDR_BOUND");
  auto l1 = c.ch->create_id();
  l1->listen(kPort, 4);
  auto l2 = c.ch->create_id();
  EXPECT_EQ(err_of([&] { l2->listen(kPort, 4); }), EADDRINUSE);
}

// Data before the RTU: the passive QP, still in RTR, raises COMM_EST; the consumer's
// ib_cm_notify (cm_establish) moves the id from REP_SENT to ESTABLISHED with USER_ESTABLISHED,
// and the pending REP is not resent.
TEST(Cm, DataBeforeRtuIsUserEstablished) {
  auto lab = lab_of({{"a", "ib"}, {"b", "ib"}});
  auto& impl = dynamic_cast<ModelLabImpl&>(*lab);
  IbCm& ca = *impl.device("a").ib_cm;
  IbCm& cb = *impl.device("b").ib_cm;
  Node a = Node::on(*lab, "a");
  Node b = Node::on(*lab, "b");
  auto qa = a.qp();
  auto qb = b.qp();
  std::vector<IbCmEventType> ea;
  std::vector<IbCmEventType> eb;
  uint32_t passive = 0;
  const uint32_t listen = ca.create_id([&](const IbCmEvent& ev) {
    ea.push_back(ev.type);
    if (ev.type == IbCmEventType::REQ_RECEIVED) passive = ev.id;
  });
  ca.listen(listen, 0x99);
  const uint32_t active = cb.create_id([&](const IbCmEvent& ev) { eb.push_back(ev.type); });
  lab->add_rule(drop_mad(0x14));  // every RTU lost
  IbCmReqParam p;
  p.service_id = 0x99;
  p.dst_host = "a";
  p.dgid = a.ctx->query_gid(1, 0);
  p.qpn = qb->qp_num();
  cb.send_req(active, p);
  lab->run_for(kNsPerMs);
  ASSERT_NE(passive, 0u);
  IbCmRepParam r;
  r.qpn = qa->qp_num();
  ca.send_rep(passive, r);
  lab->run_for(kNsPerMs);
  ASSERT_EQ(eb, std::vector<IbCmEventType>{IbCmEventType::REP_RECEIVED});
  cb.send_rtu(active);  // lost
  RcParams rc;
  to_init(*qa, rc.access);
  to_init(*qb, rc.access);
  to_rtr(*qa, b.ctx->query_gid(1, 0), qb->qp_num(), rc);  // the passive QP stays in RTR
  to_rtr(*qb, a.ctx->query_gid(1, 0), qa->qp_num(), rc);
  to_rts(*qb, rc);
  qa->post_recv(recv_wr(1, *a.mr));
  qb->post_send(send_wr(2, *b.mr));
  lab->run_for(kNsPerMs);
  EXPECT_EQ(ca.state(passive), IbCmState::ESTABLISHED);
  EXPECT_EQ(ea, (std::vector<IbCmEventType>{IbCmEventType::REQ_RECEIVED,
                                            IbCmEventType::USER_ESTABLISHED}));
  lab->run_for(10 * kNsPerSec);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "REP"), 1u);
}

// SIGKILL closes the ucma file: cm_destroy_id runs for each id, so an ESTABLISHED id sends its
// one DREQ (unlike a reboot, which sends nothing).
TEST(Cm, KilledProcessDisconnectsItsIds) {
  auto lab = lab_of({{"a", "roce"}, {"b", "roce"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  connect_pair(server, client, "a");
  const TimeNs t1 = lab->runtime().now_ns();
  client.proc->kill();
  EXPECT_TRUE(client.id->destroyed());
  EXPECT_TRUE(client.ch->destroyed());
  server.expect(E::DISCONNECTED, 0, t1 + kLatency);
  EXPECT_EQ(count_records(*lab, "cm_send", "msg", "DREQ"), 1u);
}

TEST(Cm, DumpListsCmIds) {
  auto lab = lab_of({{"a", "ib"}, {"b", "ib"}});
  CmEnd server = CmEnd::on(*lab, "a");
  CmEnd client = CmEnd::on(*lab, "b");
  connect_pair(server, client, "a");
  const std::string d = lab->dump_state();
  EXPECT_NE(d.find(client.id->label() + " rdma_cm CONNECT ib_cm ESTABLISHED"), std::string::npos)
      << d;
  EXPECT_NE(d.find("rdma_cm LISTEN ib_cm LISTEN"), std::string::npos) << d;
}

TEST(Cm, SameSeedSameHistory) {
  auto run = [] {
    auto lab = lab_of({{"a", "roce"}, {"b", "roce"}}, 7);
    CmEnd server = CmEnd::on(*lab, "a");
    CmEnd client = CmEnd::on(*lab, "b");
    connect_pair(server, client, "a");
    client.id->disconnect();
    lab->run_for(2 * kNsPerSec);
    return lab->history().to_jsonl();
  };
  EXPECT_EQ(run(), run());
}

}  // namespace
}  // namespace cm_test
}  // namespace rdmalab::model
