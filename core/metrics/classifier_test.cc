// The classifier: which history record feeds which metric, latency pairing per CM id, the
// bounded pending map, and a model lab attached end to end (observer chaining included).
#include "metrics/classifier.h"

#include <gtest/gtest.h>

#include "metrics/test_util.h"
#include "rdmalab/model.h"

namespace rdmalab::metrics {
namespace {

using nlohmann::json;
using testing::histogram_sum;
using testing::sample;

// A history on a clock the test sets, classified into a fresh Metrics: hosts a (ib), b (roce).
struct Fixture {
  TimeNs now = 0;
  History history{[this] { return now; }};
  std::shared_ptr<Metrics> m = Metrics::create();
  Classifier c;

  explicit Fixture(size_t max_pending = kMaxPendingIds)
      : c(m, "model", {{"a", "ib"}, {"b", "roce"}}, max_pending) {
    history.set_observer([this](const HistoryRecord& r) { c.observe(r); });
  }
  void at(TimeNs t, const std::string& host, const std::string& object, const std::string& kind,
          json data) {
    now = t;
    history.record(host, object, kind, std::move(data));
  }
  void verb(TimeNs t, const std::string& object, const std::string& verb) {
    at(t, "a", object, "verb", {{"verb", verb}});
  }
  void event(TimeNs t, const std::string& object, const std::string& event, int status = 0) {
    at(t, "a", object, "cm_event", {{"event", event}, {"status", status}, {"listen_id", 0}});
  }
  double connects() const {
    return sample(*m, "rdmalab_cm_connect_seconds", {{"device", "ib"}}).value_or(0);
  }
  double disconnects(const std::string& until) const {
    return sample(*m, "rdmalab_cm_disconnect_seconds", {{"until", until}}).value_or(0);
  }
};

TEST(Classifier, CmEventsCountedByEventAndStatusName) {
  Fixture f;
  f.event(1, "cm_id:5", "ESTABLISHED");
  f.event(2, "cm_id:5", "DISCONNECTED", -ETIMEDOUT);
  f.event(3, "cm_id:6", "REJECTED", REJ_STALE_CONN);
  f.at(4, "b", "cm_id:7", "cm_event", {{"event", "ESTABLISHED"}, {"status", 0}});
  const auto cm = [&](const std::string& dev, const std::string& ev, const std::string& st) {
    return sample(*f.m, "rdmalab_cm_events_total",
                  {{"backend", "model"}, {"device", dev}, {"event", ev}, {"status", st}});
  };
  EXPECT_EQ(cm("ib", "ESTABLISHED", "OK"), 1);
  EXPECT_EQ(cm("ib", "DISCONNECTED", "ETIMEDOUT"), 1);
  EXPECT_EQ(cm("ib", "REJECTED", "STALE_CONN"), 1);
  EXPECT_EQ(cm("roce", "ESTABLISHED", "OK"), 1);
  EXPECT_FALSE(cm("roce", "DISCONNECTED", "ETIMEDOUT").has_value());
}

TEST(Classifier, ConnectLatencyIsRdmaConnectToEstablished) {
  Fixture f;
  f.verb(100, "cm_id:5", "rdma_connect");
  f.event(4100, "cm_id:5", "ESTABLISHED");
  EXPECT_EQ(f.connects(), 1);
  EXPECT_DOUBLE_EQ(*histogram_sum(*f.m, "rdmalab_cm_connect_seconds", {}), 4000e-9);
  EXPECT_EQ(f.c.pending(), 0u);             // nothing left to measure for the id
  f.event(5000, "cm_id:9", "ESTABLISHED");  // the passive side: no rdma_connect, no sample
  EXPECT_EQ(f.connects(), 1);
}

TEST(Classifier, FailedConnectMeasuresNothing) {
  Fixture f;
  f.verb(100, "cm_id:5", "rdma_connect");
  f.event(200, "cm_id:5", "REJECTED", REJ_CONSUMER_DEFINED);
  f.event(300, "cm_id:5", "ESTABLISHED");  // not after a REJECTED; and not measured if it were
  EXPECT_EQ(f.connects(), 0);
  EXPECT_EQ(f.c.pending(), 0u);
}

TEST(Classifier, DisconnectToDisconnectedAndToTimewaitExit) {
  Fixture f;
  f.verb(1000, "cm_id:5", "rdma_disconnect");
  f.verb(1500, "cm_id:5", "rdma_disconnect");  // a second call does not restart the clock
  f.event(3000, "cm_id:5", "DISCONNECTED", -ETIMEDOUT);
  f.event(9000, "cm_id:5", "TIMEWAIT_EXIT");
  EXPECT_EQ(f.disconnects("DISCONNECTED"), 1);
  EXPECT_EQ(f.disconnects("TIMEWAIT_EXIT"), 1);
  EXPECT_DOUBLE_EQ(
      *histogram_sum(*f.m, "rdmalab_cm_disconnect_seconds", {{"until", "DISCONNECTED"}}), 2000e-9);
  EXPECT_DOUBLE_EQ(
      *histogram_sum(*f.m, "rdmalab_cm_disconnect_seconds", {{"until", "TIMEWAIT_EXIT"}}), 8000e-9);
  EXPECT_EQ(f.c.pending(), 0u);
}

TEST(Classifier, PeerDisconnectedFirstMeasuresOnlyTimewait) {
  Fixture f;
  f.event(1000, "cm_id:10", "DISCONNECTED");  // the peer's DREQ
  f.verb(1000, "cm_id:10", "rdma_disconnect");
  f.event(5000, "cm_id:10", "TIMEWAIT_EXIT");
  EXPECT_EQ(f.disconnects("DISCONNECTED"), 0);
  EXPECT_EQ(f.disconnects("TIMEWAIT_EXIT"), 1);
}

TEST(Classifier, DestroyForgetsTheIdUnlessItFailed) {
  Fixture f;
  f.verb(100, "cm_id:5", "rdma_connect");
  f.at(200, "a", "cm_id:5", "verb", {{"verb", "rdma_destroy_id"}, {"err", EBUSY}});
  EXPECT_EQ(f.c.pending(), 1u);
  f.verb(300, "cm_id:5", "rdma_destroy_id");
  EXPECT_EQ(f.c.pending(), 0u);
  f.verb(400, "cm_id:6", "rdma_connect");
  f.at(500, "a", "cm_id:6", "destroyed_by_kill", {{"verb", "rdma_destroy_id"}});
  EXPECT_EQ(f.c.pending(), 0u);
}

TEST(Classifier, PendingIdsAreBoundedOldestFirst) {
  Fixture f(2);
  f.verb(100, "cm_id:1", "rdma_connect");
  f.verb(200, "cm_id:2", "rdma_connect");
  f.verb(300, "cm_id:3", "rdma_connect");
  EXPECT_EQ(f.c.pending(), 2u);
  f.event(400, "cm_id:1", "ESTABLISHED");  // evicted: not measured
  EXPECT_EQ(f.connects(), 0);
  f.event(500, "cm_id:2", "ESTABLISHED");
  f.event(600, "cm_id:3", "ESTABLISHED");
  EXPECT_EQ(f.connects(), 2);
}

TEST(Classifier, FabricFaultsCountAsFaultsAndSwitchFrames) {
  Fixture f;
  f.at(10, "b", "fabric", "fault", {{"fault", "drop"}, {"opcode", "MAD"}, {"mad_attr_id", 0x16}});
  f.at(20, "a", "fabric", "fault", {{"fault", "delay"}, {"opcode", "SEND_ONLY"}});
  f.at(30, "a", "fabric", "fault", {{"fault", "host_down_drop"}, {"opcode", "MPA_REQUEST"}});
  f.at(40, "a", "host", "fault", {{"fault", "reboot"}, {"down_ns", 5}});
  const auto frames = [&](const std::string& type, const std::string& action) {
    return sample(*f.m, "rdmalab_switch_frames_total",
                  {{"backend", "model"}, {"type", type}, {"action", action}});
  };
  EXPECT_EQ(frames("DREP", "drop"), 1);
  EXPECT_EQ(frames("SEND_ONLY", "delay"), 1);
  EXPECT_EQ(frames("MPA_REQUEST", "drop"), 1);
  EXPECT_EQ(sample(*f.m, "rdmalab_faults_total", {{"device", "roce"}, {"kind", "drop"}}), 1);
  EXPECT_EQ(sample(*f.m, "rdmalab_faults_total", {{"device", "ib"}, {"kind", "host_down_drop"}}),
            1);
  EXPECT_EQ(sample(*f.m, "rdmalab_faults_total", {{"device", "ib"}, {"kind", "reboot"}}), 1);
  EXPECT_FALSE(frames("none", "none").has_value());  // a reboot is no frame
}

// A MAD frame is named by the CM attribute table (rdmalab/types.h); other IDs stay "MAD".
TEST(Classifier, MadFramesNamedByTheCmAttributeTable) {
  EXPECT_EQ(frame_type({{"opcode", "MAD"}, {"mad_attr_id", 0x10}}), "REQ");
  EXPECT_EQ(frame_type({{"opcode", "MAD"}, {"mad_attr_id", 0x18}}), "SIDR_REP");
  EXPECT_EQ(frame_type({{"opcode", "MAD"}, {"mad_attr_id", 0x1A}}), "APR");
  EXPECT_EQ(frame_type({{"opcode", "MAD"}, {"mad_attr_id", 0x42}}), "MAD");
  EXPECT_EQ(frame_type({{"opcode", "MAD"}, {"mad_attr_id", 0x10010}}), "MAD");  // not 0x10
  EXPECT_EQ(frame_type({{"opcode", "MAD"}, {"mad_attr_id", -1}}), "MAD");
  EXPECT_EQ(frame_type({{"opcode", "MAD"}}), "MAD");
}

TEST(Classifier, CompletionsAsyncEventsAndDrain) {
  Fixture f;
  f.at(1, "a", "qp:3", "wc", {{"status", "SUCCESS"}, {"qp_num", 256}, {"wr_id", 7}});
  f.at(2, "a", "qp:3", "wc", {{"status", "WR_FLUSH_ERR"}, {"qp_num", 256}, {"wr_id", 8}});
  f.at(3, "a", "qp:3", "wc", {{"status", "WR_FLUSH_ERR"}, {"qp_num", 256}, {"wr_id", 9}});
  f.at(4, "b", "qp:4", "async_event", {{"event", "QP_FATAL"}, {"number", 17}});
  f.at(5, "a", "qp:3", "drain_end", {{"method", "marker"}, {"elapsed_ns", 3000}});
  EXPECT_EQ(sample(*f.m, "rdmalab_work_completions_total", {{"status", "WR_FLUSH_ERR"}}), 2);
  EXPECT_EQ(sample(*f.m, "rdmalab_work_completions_total", {{"status", "SUCCESS"}}), 1);
  EXPECT_EQ(sample(*f.m, "rdmalab_async_events_total", {{"device", "roce"}, {"event", "QP_FATAL"}}),
            1);
  EXPECT_EQ(sample(*f.m, "rdmalab_drain_seconds", {{"method", "marker"}}), 1);
  EXPECT_DOUBLE_EQ(*histogram_sum(*f.m, "rdmalab_drain_seconds", {}), 3000e-9);
  // Labels stay bounded: no QPN, wr_id or object label reaches the exposition.
  const std::string text = f.m->text();
  EXPECT_EQ(text.find("qp:3"), std::string::npos);
  EXPECT_EQ(text.find("256"), std::string::npos);
}

TEST(Classifier, UnknownHostAndOddValuesGiveBoundedLabels) {
  Fixture f;
  f.at(1, "z", "qp:1", "wc", {{"status", std::string(100, 'X')}});
  EXPECT_EQ(
      sample(*f.m, "rdmalab_work_completions_total", {{"device", "none"}, {"status", "other"}}), 1);
  EXPECT_EQ(bounded("a b"), "other");
  EXPECT_EQ(bounded(""), "none");
  EXPECT_EQ(bounded("iwarp-cxgb4"), "iwarp-cxgb4");
  EXPECT_EQ(cm_status_name("DISCONNECTED", 0), "OK");
  EXPECT_EQ(cm_status_name("UNREACHABLE", -ETIMEDOUT), "ETIMEDOUT");
  EXPECT_EQ(cm_status_name("REJECTED", REJ_INVALID_SERVICE_ID), "INVALID_SERVICE_ID");
  EXPECT_EQ(cm_status_name("REJECTED", 13), "13");
  EXPECT_EQ(cm_status_name("REJECTED", 100000), "other");
}

// A model lab end to end: device faults counted under the hosts' personalities, outcome series
// declared at 0, and an observer set before attach still called.
TEST(Classifier, AttachedModelLabCountsItsFaultsAndChainsTheObserver) {
  model::LabOptions o;
  o.hosts = {{"a", "ib", std::nullopt}, {"b", "iwarp-siw", std::nullopt}};
  auto lab = model::make_lab(o);
  size_t seen_before = 0;
  lab->history().set_observer([&](const HistoryRecord&) { ++seen_before; });
  auto m = Metrics::create();
  m->attach(*lab);
  EXPECT_EQ(sample(*m, "rdmalab_scenario_outcomes_total",
                   {{"backend", "model"}, {"device", "iwarp-siw"}, {"outcome", "failed"}}),
            0);
  EXPECT_EQ(
      sample(*m, "rdmalab_cm_disconnect_seconds", {{"device", "ib"}, {"until", "TIMEWAIT_EXIT"}}),
      0);  // a histogram series declared with no observation yet
  const size_t before = seen_before;
  lab->set_port_state("a", false);
  lab->run_for(kNsPerMs);
  lab->rdma_link_delete("b");
  lab->run_for(kNsPerMs);
  EXPECT_GT(seen_before, before);
  EXPECT_EQ(sample(*m, "rdmalab_faults_total", {{"device", "ib"}, {"kind", "port_down"}}), 1);
  EXPECT_EQ(sample(*m, "rdmalab_faults_total", {{"device", "iwarp-siw"}, {"kind", "rdma_link_delete"}}),
            1);
  EXPECT_EQ(sample(*m, "rdmalab_async_events_total", {{"device", "ib"}, {"event", "PORT_ERR"}}), 1);
  lab->shutdown();
}

}  // namespace
}  // namespace rdmalab::metrics
