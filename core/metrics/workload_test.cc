// A workload's records as metrics: steps by outcome, unit states, I/O counts, the read-back's
// blocks and the time a unit took back to live, through the lab's classifier.
#include "metrics/workload.h"

#include <gtest/gtest.h>

#include "metrics/classifier.h"
#include "metrics/test_util.h"

namespace rdmalab::metrics {
namespace workload_test {  // its own: the tests compile in batches

using nlohmann::json;
using testing::histogram_sum;
using testing::sample;

constexpr TimeNs kSec = kNsPerSec;

// A VM lab's history of a workload: target on a, initiator on b (both rxe).
struct Fixture {
  TimeNs now = 0;
  History history{[this] { return now; }};
  std::shared_ptr<Metrics> m = Metrics::create();
  Classifier c{m, "vm", {{"a", "rxe"}, {"b", "rxe"}}};

  Fixture() {
    history.set_observer([this](const HistoryRecord& r) { c.observe(r); });
  }
  void at(TimeNs t, const std::string& host, const std::string& kind, json data) {
    now = t;
    history.record(host, "nvme", kind, std::move(data));  // an NVMe-oF workload
  }
  void state(TimeNs t, const std::string& previous, const std::string& state,
             const std::string& unit = "nvme0") {
    at(t, "b", "ulp_state", {{"unit", unit}, {"previous", previous}, {"state", state}});
  }
};

TEST(Workload, StepsCountedByStepAndOutcomeOnTheirHost) {
  Fixture f;
  f.at(1, "a", "workload", {{"step", "target_up"}, {"ok", true}, {"took_ns", 5}});
  f.at(2, "b", "workload",
       {{"step", "connect"}, {"ok", false}, {"error", "refused"}, {"errno", 111}});
  f.at(3, "b", "workload", {{"step", "connect"}, {"ok", true}, {"took_ns", 9}});
  const auto steps = [&](const std::string& host, const std::string& step,
                         const std::string& outcome) {
    return sample(*f.m, "rdmalab_workload_steps_total",
                  {{"backend", "vm"},
                   {"device", "rxe"},
                   {"workload", "nvme"},
                   {"host", host},
                   {"step", step},
                   {"outcome", outcome}});
  };
  EXPECT_EQ(steps("a", "target_up", "ok"), 1);
  EXPECT_EQ(steps("a", "target_up", "failed"), 0);  // declared with its step
  EXPECT_EQ(steps("b", "connect", "ok"), 1);
  EXPECT_EQ(steps("b", "connect", "failed"), 1);
  EXPECT_FALSE(steps("b", "target_up", "ok").has_value());
}

TEST(Workload, IoCountsAndTheReadBacksBlocks) {
  Fixture f;
  f.at(1, "b", "io", {{"op", "write"}, {"phase", "progress"}, {"ok", 148}, {"errors", 0}});
  f.at(2, "b", "io", {{"op", "write"}, {"phase", "errors"}, {"ok", 3}, {"errors", 1}});
  f.at(3, "b", "io", {{"op", "write"}, {"phase", "resumed"}, {"ok", 1}, {"errors", 37}});
  f.at(4, "b", "io_verify",
       {{"blocks", 512},
        {"acked", 381},
        {"matched", 378},
        {"pending", 1},
        {"lost", json::array({3, 9})},
        {"lost_count", 2},
        {"corrupt", json::array({7})},
        {"corrupt_count", 1}});
  f.at(5, "b", "io_verify", {{"matched", 2}, {"lost", json::array({1, 2, 3})}});  // no counts
  const auto io = [&](const std::string& result) {
    return sample(*f.m, "rdmalab_workload_io_total",
                  {{"host", "b"}, {"workload", "nvme"}, {"op", "write"}, {"result", result}});
  };
  EXPECT_EQ(io("ok"), 152);
  EXPECT_EQ(io("error"), 38);
  const auto blocks = [&](const std::string& result) {
    return sample(*f.m, "rdmalab_workload_verify_blocks_total", {{"result", result}});
  };
  EXPECT_EQ(blocks("matched"), 380);
  EXPECT_EQ(blocks("pending"), 1);
  EXPECT_EQ(blocks("lost"), 5);
  EXPECT_EQ(blocks("corrupt"), 1);
}

TEST(Workload, RecoveryIsLeavingLiveToLiveAgain) {
  Fixture f;
  f.state(1 * kSec, "", "live");  // connected: not a recovery
  EXPECT_EQ(sample(*f.m, "rdmalab_ulp_recovery_seconds", {{"host", "b"}}), 0);  // declared
  f.state(10 * kSec, "live", "resetting");
  f.state(16 * kSec, "resetting", "connecting");
  EXPECT_EQ(f.c.pending(), 0u);  // the CM ids' map is apart
  f.state(39 * kSec, "connecting", "live");
  EXPECT_EQ(sample(*f.m, "rdmalab_ulp_recovery_seconds", {{"host", "b"}}), 1);
  EXPECT_DOUBLE_EQ(*histogram_sum(*f.m, "rdmalab_ulp_recovery_seconds", {}), 29.0);
  // Torn down: deleting, then gone, measures nothing and forgets the unit.
  f.state(50 * kSec, "live", "deleting (no IO)");
  f.state(51 * kSec, "deleting (no IO)", "gone");
  f.state(60 * kSec, "", "live");
  EXPECT_EQ(sample(*f.m, "rdmalab_ulp_recovery_seconds", {{"host", "b"}}), 1);
  const auto entered = [&](const std::string& state) {
    return sample(*f.m, "rdmalab_ulp_state_changes_total", {{"host", "b"}, {"state", state}});
  };
  EXPECT_EQ(entered("live"), 3);
  EXPECT_EQ(entered("resetting"), 1);
  EXPECT_EQ(entered("deleting_no_IO"), 1);
  EXPECT_EQ(entered("gone"), 1);
}

// An iSER session and its SCSI disk recover in their own words: LOGGED_IN, running.
TEST(Workload, EachUnitRecoversToItsOwnWorkingState) {
  Fixture f;
  const auto state = [&](TimeNs t, const std::string& unit, const std::string& previous,
                         const std::string& to) {
    f.now = t;
    f.history.record("b", "iser", "ulp_state",
                     {{"unit", unit}, {"previous", previous}, {"state", to}});
  };
  state(1 * kSec, "session1", "", "LOGGED_IN");
  state(1 * kSec, "sdb", "", "running");
  state(5 * kSec, "session1", "LOGGED_IN", "FAILED");
  state(5 * kSec, "sdb", "running", "blocked");
  state(9 * kSec, "session1", "FAILED", "LOGGED_IN");
  state(12 * kSec, "sdb", "blocked", "running");
  EXPECT_EQ(sample(*f.m, "rdmalab_ulp_recovery_seconds", {{"workload", "iser"}}), 2);
  EXPECT_DOUBLE_EQ(*histogram_sum(*f.m, "rdmalab_ulp_recovery_seconds", {{"workload", "iser"}}),
                   4.0 + 7.0);
}

TEST(Workload, UnitsNotWorkingAreBoundedOldestFirst) {
  auto m = Metrics::create();
  WorkloadClassifier w(m, 2);
  TimeNs t = 0;
  const auto state = [&](const std::string& unit, const std::string& previous,
                         const std::string& to) {
    HistoryRecord r;
    r.t_ns = ++t;
    r.host = "b";
    r.object = "nvme";
    r.kind = "ulp_state";
    r.data = {{"unit", unit}, {"previous", previous}, {"state", to}};
    w.observe(r, Source{"vm", "rxe"});
  };
  state("nvme0", "live", "resetting");
  state("nvme1", "live", "resetting");
  state("nvme2", "live", "resetting");
  EXPECT_EQ(w.units_not_working(), 2u);
  state("nvme0", "resetting", "live");  // forgotten: not measured
  EXPECT_EQ(sample(*m, "rdmalab_ulp_recovery_seconds", {}), 0);
  state("nvme2", "resetting", "live");
  EXPECT_EQ(sample(*m, "rdmalab_ulp_recovery_seconds", {}), 1);
  EXPECT_EQ(w.units_not_working(), 1u);
}

TEST(Workload, StateLabelsAreBoundedNames) {
  EXPECT_EQ(state_label("live"), "live");
  EXPECT_EQ(state_label("deleting (no IO)"), "deleting_no_IO");
  EXPECT_EQ(state_label(""), "none");
  EXPECT_EQ(state_label(std::string(60, 'x')), "other");
  EXPECT_TRUE(WorkloadClassifier::counts("io_verify"));
  EXPECT_FALSE(WorkloadClassifier::counts("cm_event"));
}

// A finished history (the VM lab's) is counted the same way, its host's device as the label.
TEST(Workload, IngestedHistoryCountsUnderTheHostsDevice) {
  auto m = Metrics::create();
  m->ingest(
      "vm", {{"a", "siw"}, {"b", "siw"}},
      R"({"seq":3,"t_ns":10,"host":"b","object":"nvme","kind":"workload","data":{"step":"connect","ok":true,"took_ns":7}})"
      "\n");
  EXPECT_NE(
      m->text().find(
          R"(rdmalab_workload_steps_total{backend="vm",device="siw",host="b",outcome="ok",step="connect",workload="nvme"} 1)"),
      std::string::npos)
      << m->text();
}

}  // namespace workload_test
}  // namespace rdmalab::metrics
