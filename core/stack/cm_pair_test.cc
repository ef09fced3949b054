// cm_pair_up, cm_pair_disconnect and cm_channel_close on the model: a pair up and down in one
// call each on IB and iWARP; a bring-up stops at the step that fails and keeps what it made; a
// channel with a request nobody took is not closed behind its caller's back.
#include "stack/cm_pair.h"

#include <gtest/gtest.h>

#include "rdmalab/error.h"
#include "stack/test_lab.h"

namespace rdmalab::stack {
namespace cm_pair_test {

constexpr uint16_t kPort = 7472;
const std::vector<CmEventType> kEstablished = {CmEventType::ESTABLISHED, CmEventType::REJECTED,
                                               CmEventType::UNREACHABLE,
                                               CmEventType::CONNECT_ERROR};
const std::vector<CmEventType> kDisconnected = {CmEventType::DISCONNECTED};

// Client on host a, server on host b, each with its own channel and pump.
struct Pair {
  explicit Pair(const std::string& personality)
      : lab(personality),
        client(lab.rt(), lab.a.proc->create_event_channel(), &lab.history(), "a"),
        server(lab.rt(), lab.b.proc->create_event_channel(), &lab.history(), "b") {
    client.start();
    server.start();
  }
  ~Pair() {
    if (client.running()) client.stop(lab.in(kNsPerSec));
    if (server.running()) server.stop(lab.in(kNsPerSec));
  }
  void up(CmPairUp& st, std::optional<CmEndpointSpec> connect_spec = std::nullopt) {
    cm_pair_up(st, lab.rt(), server, client, kPort, "b", std::move(connect_spec), std::nullopt,
               kNsPerSec, kEstablished);
  }

  fixture::TwoHosts lab;
  CmEventPump client;
  CmEventPump server;
};

class CmPairTransportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CmPairTransportTest, UpDownAndClose) {
  Pair p(GetParam());
  CmPairUp up;
  p.up(up);
  ASSERT_TRUE(up.ok);
  ASSERT_TRUE(up.client && up.server && up.request);
  EXPECT_EQ(up.request->event, CmEventType::CONNECT_REQUEST);
  EXPECT_EQ(up.request->listen_id, up.listener->id());
  EXPECT_EQ(up.server->id->id(), up.request->id);
  EXPECT_GT(up.request_ns, 0);
  EXPECT_EQ(up.client_ctx->owner().host, "a");
  EXPECT_EQ(up.server_ctx->owner().host, "b");
  EXPECT_TRUE(up.client_waited && up.server_waited);
  EXPECT_EQ(up.client_established->event.event, CmEventType::ESTABLISHED);
  EXPECT_EQ(up.server_established->event.event, CmEventType::ESTABLISHED);
  EXPECT_EQ(up.client->qp->state(), QpState::RTS);
  EXPECT_EQ(up.server->qp->state(), QpState::RTS);

  CmPairDown down;
  cm_pair_disconnect(down, p.lab.rt(), p.client, *up.client->id, p.server, *up.server->id,
                     kNsPerSec, kDisconnected);
  EXPECT_TRUE(down.ok);
  EXPECT_TRUE(down.server_waited && down.client_waited);

  CmChannelClose client_close, server_close;
  EXPECT_TRUE(cm_channel_close(client_close, p.lab.rt(), p.client, {*up.client}, {}, kNsPerSec));
  const CmConnection listener{up.listener, nullptr, nullptr, nullptr};
  EXPECT_TRUE(cm_channel_close(server_close, p.lab.rt(), p.server, {*up.server, listener},
                               {up.listener->id()}, kNsPerSec));
  EXPECT_TRUE(client_close.stopped && server_close.stopped);
  EXPECT_TRUE(up.client->id->destroyed());
  EXPECT_TRUE(up.server->id->destroyed());
  EXPECT_FALSE(p.client.running());
}

INSTANTIATE_TEST_SUITE_P(Transports, CmPairTransportTest, ::testing::Values("ib", "iwarp-siw"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

// No listener on the port connected to: REJECTED, no request; what was made stays.
TEST(CmPairTest, StopsAtTheStepThatFails) {
  Pair p("ib");
  CmEndpointSpec spec;
  spec.dst = "b";
  spec.port = kPort + 1;
  CmPairUp up;
  p.up(up, spec);
  EXPECT_FALSE(up.ok);
  ASSERT_TRUE(up.listener && up.client);
  EXPECT_FALSE(up.request.has_value());
  EXPECT_FALSE(up.server.has_value());
  EXPECT_FALSE(up.client_waited);
  const auto seen = p.client.events(up.client->id->id());
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().event.event, CmEventType::REJECTED);
  cm_close(p.client, *up.client, p.lab.in(kNsPerSec));
}

// A CONNECT_REQUEST whose id is none of the connections given: nothing is closed.
TEST(CmPairTest, ChannelCloseRefusesARequestItWasNotGiven) {
  Pair p("ib");
  auto listener = cm_listen(p.server, kPort);
  CmEndpointSpec spec;
  spec.dst = "b";
  spec.port = kPort;
  CmConnection c = cm_connect(p.client, spec, p.lab.in(kNsPerSec));
  ASSERT_TRUE(p.server.next_connect_request(listener->id(), p.lab.in(kNsPerSec)));
  CmChannelClose st;
  EXPECT_FALSE(cm_channel_close(st, p.lab.rt(), p.server, {}, {listener->id()}, kNsPerSec));
  EXPECT_FALSE(st.stopped);
  EXPECT_TRUE(p.server.running());
  EXPECT_FALSE(listener->destroyed());
  cm_close(p.client, c, p.lab.in(kNsPerSec));
}

TEST(CmPairTest, NoEventToWaitForIsRefused) {
  Pair p("ib");
  CmPairUp up;
  try {
    cm_pair_up(up, p.lab.rt(), p.server, p.client, kPort, "b", std::nullopt, std::nullopt,
               kNsPerSec, {});
    FAIL() << "waited for nothing";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EINVAL);
  }
  EXPECT_FALSE(up.listener);  // refused before any step
}

}  // namespace cm_pair_test
}  // namespace rdmalab::stack
