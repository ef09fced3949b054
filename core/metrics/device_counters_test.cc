// Device counters from a FAKE sysfs tree (a temp directory laid out as
// /sys/class/infiniband/<dev>/ports/<port>/{counters,hw_counters}), from `rdma statistic show`
// text, and their export: read at every collection, snapshots set per host.
#include "metrics/device_counters.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "metrics/metrics.h"
#include "metrics/test_util.h"

namespace rdmalab::metrics {
namespace {

namespace fs = std::filesystem;
using testing::sample;

class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("rdmalab-fake-sysfs-" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const std::string& rel, const std::string& content) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << content;
  }

  fs::path root_;
};

TEST_F(FakeSysfs, ReadsCountersAndHwCountersOfEveryPort) {
  write("rxe0/ports/1/hw_counters/sent_pkts", "12\n");
  write("rxe0/ports/1/hw_counters/rcvd_pkts", "34\n");
  write("rxe0/ports/1/counters/port_xmit_data", "1000\n");
  write("mlx5_0/ports/2/counters/symbol_error", "0\n");
  write("mlx5_0/ports/2/hw_counters/lifespan", "N/A\n");  // not a number: skipped
  write("mlx5_0/ports/2/hw_counters/bad name", "5\n");    // not a label-safe name: skipped
  write("mlx5_0/ports/x/counters/port_rcv_data", "5\n");  // not a port number: skipped
  const auto got = read_sysfs_counters(root_);
  const std::vector<DeviceCounter> want = {
      {"mlx5_0", 2, "counters", "symbol_error", 0},
      {"rxe0", 1, "counters", "port_xmit_data", 1000},
      {"rxe0", 1, "hw_counters", "rcvd_pkts", 34},
      {"rxe0", 1, "hw_counters", "sent_pkts", 12},
  };
  EXPECT_EQ(got, want);
}

TEST_F(FakeSysfs, MissingRootGivesNothing) {
  EXPECT_TRUE(read_sysfs_counters(root_ / "absent").empty());
}

TEST_F(FakeSysfs, WatchedTreeIsReadAtEveryCollection) {
  write("rxe0/ports/1/hw_counters/retry_exceeded_err", "1\n");
  auto m = Metrics::create();
  m->watch_device_counters(root_.string(), "h1");
  const testing::LabelMap labels = {{"host", "h1"},
                                    {"device", "rxe0"},
                                    {"port", "1"},
                                    {"source", "hw_counters"},
                                    {"counter", "retry_exceeded_err"}};
  EXPECT_EQ(sample(*m, "rdmalab_device_counter", labels), 1);
  write("rxe0/ports/1/hw_counters/retry_exceeded_err", "3\n");
  EXPECT_EQ(sample(*m, "rdmalab_device_counter", labels), 3);
  EXPECT_NE(m->text().find("rdmalab_device_counter{"), std::string::npos);
}

TEST(DeviceCounters, SnapshotsReplacePerHostAndNothingIsExportedWithoutThem) {
  auto m = Metrics::create();
  EXPECT_EQ(m->text().find("rdmalab_device_counter"), std::string::npos);
  m->set_device_counters("guest-a", {{"siw0", 1, "rdma_statistic", "sent_pkts", 5}});
  m->set_device_counters("guest-b", {{"rxe0", 1, "rdma_statistic", "sent_pkts", 7}});
  m->set_device_counters("guest-a", {{"siw0", 1, "rdma_statistic", "sent_pkts", 9}});
  EXPECT_EQ(sample(*m, "rdmalab_device_counter", {{"host", "guest-a"}}), 9);
  EXPECT_EQ(sample(*m, "rdmalab_device_counter", {{"host", "guest-b"}, {"device", "rxe0"}}), 7);
}

TEST(DeviceCounters, ParsesRdmaStatisticShow) {
  // iproute2 prints one line per link; a long one may wrap.
  const std::string text =
      "link rxe0/1 sent_pkts 10 rcvd_pkts 20 duplicate_request 0\n"
      "     out_of_seq_request 3\n"
      "link mlx5_0/1 rx_write_requests 7\n"
      "link broken cnt 1\n";
  const auto got = parse_rdma_statistic(text);
  const std::vector<DeviceCounter> want = {
      {"rxe0", 1, "rdma_statistic", "sent_pkts", 10},
      {"rxe0", 1, "rdma_statistic", "rcvd_pkts", 20},
      {"rxe0", 1, "rdma_statistic", "duplicate_request", 0},
      {"rxe0", 1, "rdma_statistic", "out_of_seq_request", 3},
      {"mlx5_0", 1, "rdma_statistic", "rx_write_requests", 7},
  };
  EXPECT_EQ(got, want);
  EXPECT_TRUE(parse_rdma_statistic("").empty());
  EXPECT_TRUE(is_counter_name("port_xmit_data"));
  EXPECT_FALSE(is_counter_name("a-b"));
}

}  // namespace
}  // namespace rdmalab::metrics
