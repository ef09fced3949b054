#include "verbs/verbs_lab.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "rdmalab/error.h"
#include "verbs/context.h"
#include "verbs/stall_meter.h"
#include "verbs/test_util.h"

namespace rdmalab::verbs {
namespace {

// This process's threads named `name`, waiting up to 5 s for there to be `want` of them: a new
// thread names itself once it runs, and a joined thread's /proc entry may outlive the join by a
// moment (the kernel wakes the joiner before it releases the task).
size_t threads_named(const std::string& name, size_t want) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    size_t n = 0;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream comm(task.path() / "comm");
      std::string line;
      if (std::getline(comm, line) && line == name) ++n;
    }
    if (n == want || std::chrono::steady_clock::now() >= give_up) return n;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(VerbsLab, HasOneLocalHostAndRealTime) {
  VerbsLab lab(1);
  EXPECT_EQ(lab.backend(), "verbs");
  EXPECT_EQ(lab.seed(), 1u);
  ASSERT_EQ(lab.hosts().size(), 1u);
  EXPECT_EQ(lab.hosts()[0]->name(), "local");
  EXPECT_EQ(lab.host("local"), lab.hosts()[0]);
  try {
    lab.host("server");
    FAIL() << "unknown host accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), ENOENT);
  }
  const TimeNs t0 = lab.runtime().now_ns();
  lab.history().record("local", "lab", "mark");
  // The mark by its kind, not as the first record: on a loaded machine the stall meter may
  // have recorded a stall before it (a TSan run in a siw guest beside stress-ng).
  const auto records = lab.history().snapshot();
  const auto mark = std::find_if(records.begin(), records.end(),
                                 [](const HistoryRecord& r) { return r.kind == "mark"; });
  ASSERT_NE(mark, records.end());
  EXPECT_GE(mark->t_ns, t0);
  EXPECT_GT(t0, 0);  // CLOCK_MONOTONIC, not a virtual clock at 0
}

TEST(VerbsLab, ProcessIsThisProcessAndCannotBeKilled) {
  VerbsLab lab(1);
  auto p = lab.host("local")->create_process("server");
  EXPECT_EQ(p->name(), "server");
  EXPECT_EQ(p->pid(), static_cast<uint64_t>(::getpid()));
  EXPECT_TRUE(p->alive());
  EXPECT_EQ(lab.host("local")->processes().size(), 1u);
  try {
    p->kill();
    FAIL() << "kill accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EOPNOTSUPP);
  }
  EXPECT_TRUE(p->alive());
}

TEST(VerbsLab, ShutdownIsIdempotent) {
  VerbsLab lab(1);
  lab.shutdown();
  lab.shutdown();
  EXPECT_TRUE(lab.runtime().stopping());
}

TEST(VerbsLabNoDevice, OpenDeviceIsEnodev) {
  if (::rdmalab::verbs::testing::sysfs_has_rdma_device())
    GTEST_SKIP() << "this machine has a device";
  VerbsLab lab(1);
  EXPECT_TRUE(lab.host("local")->device_names().empty());
  auto p = lab.host("local")->create_process("client");
  try {
    p->open_device("");
    FAIL() << "opened a device on a machine without one";
  } catch (const Error& e) {
    EXPECT_EQ(e.verb(), "ibv_open_device");
    EXPECT_EQ(e.err(), ENODEV);
  }
}

TEST(VerbsLabNoDevice, DeviceCapsIsEnodev) {
  if (::rdmalab::verbs::testing::sysfs_has_rdma_device())
    GTEST_SKIP() << "this machine has a device";
  VerbsLab lab(1);
  try {
    lab.host("local")->device_caps("mlx5_0");
    FAIL() << "caps of a device that is not there";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), ENODEV);
  }
}

TEST(VerbsLab, ShutdownStopsHarnessThreads) {
  VerbsLab lab(1);
  std::atomic<bool> returned{false};
  lab.runtime().spawn("worker", [&] {
    while (!lab.runtime().stopping()) {
      lab.runtime().wait_until([] { return false; }, lab.runtime().now_ns() + 60 * kNsPerSec);
    }
    returned = true;
  });
  lab.shutdown();
  EXPECT_TRUE(returned.load());
}

// The lab's threads (its stall meter's too) end with shutdown, not with the object: a host
// agent keeps a shut lab's object until its controller lets go of it, and it makes one lab
// per scenario (a guest once ran a meter for every scenario before).
TEST(VerbsLab, ShutdownEndsEveryThreadOfTheLab) {
  const std::string meter = StallMeter::kThreadName;
  ASSERT_EQ(threads_named(meter, 0), 0u) << "an earlier lab's meter is still running";
  VerbsLab lab(1);
  EXPECT_EQ(threads_named(meter, 1), 1u) << "the lab's meter did not start";
  lab.shutdown();
  EXPECT_EQ(threads_named(meter, 0), 0u) << "the meter outlived the lab's shutdown";
}

// The tests below need a device (rxe/siw in the VM lab, mlx5 on hardware).

TEST(VerbsDevice, CapsAndPort) {
  RDMALAB_REQUIRE_DEVICE();
  VerbsLab lab(1);
  auto host = lab.host("local");
  ASSERT_FALSE(host->device_names().empty());
  const DeviceCaps caps = host->device_caps(host->device_names()[0]);
  EXPECT_EQ(caps.name, host->device_names()[0]);
  EXPECT_FALSE(caps.personality.empty());
  EXPECT_GT(caps.max_qp, 0u);
  auto ctx = host->create_process("p")->open_device("");
  EXPECT_NE(ctx->query_port(1), PortState::INIT);  // any real state but the transient one
}

// RDMALAB_DEVICES names a host's own devices where one kernel lists several hosts' (the netns
// lab): the others are neither listed nor opened.
TEST(VerbsDevice, OnlyTheHostsOwnDevices) {
  RDMALAB_REQUIRE_DEVICE();
  VerbsLab lab(1);
  auto host = lab.host("local");
  const std::string first = host->device_names().at(0);
  ::setenv("RDMALAB_DEVICES", "nosuchdev0", 1);
  EXPECT_TRUE(host->device_names().empty());
  try {
    host->create_process("p")->open_device("");
    ADD_FAILURE() << "opened a device RDMALAB_DEVICES does not name";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), ENODEV);
    EXPECT_NE(e.detail().find("RDMALAB_DEVICES=nosuchdev0"), std::string::npos) << e.detail();
  }
  ::setenv("RDMALAB_DEVICES", (",," + first + ",other").c_str(), 1);
  EXPECT_EQ(host->device_names(), std::vector<std::string>{first});
  EXPECT_EQ(host->create_process("q")->open_device("")->caps().name, first);
  ::unsetenv("RDMALAB_DEVICES");
}

TEST(VerbsDevice, ObjectsAfterCloseAreEbadf) {
  RDMALAB_REQUIRE_DEVICE();
  VerbsLab lab(1);
  auto ctx = lab.host("local")->create_process("p")->open_device("");
  auto pd = ctx->alloc_pd();
  auto cq = ctx->create_cq(16);
  auto mr = ctx->reg_mr(*pd, 4096, ACCESS_LOCAL_WRITE);
  mr->write(0, {1, 2, 3});
  EXPECT_EQ(mr->read(0, 3), (std::vector<uint8_t>{1, 2, 3}));
  QpInitAttr init;
  init.pd = pd;
  init.send_cq = cq;
  init.recv_cq = cq;
  auto qp = ctx->create_qp(init);
  EXPECT_EQ(qp->state(), QpState::RESET);
  QpAttr a;
  a.qp_state = QpState::INIT;
  a.port_num = 1;
  a.qp_access_flags = ACCESS_REMOTE_WRITE;
  qp->modify(a, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS);
  // siw before 6.8 answers ibv_query_qp without the state (finding siw-query-qp-reports-no-state).
  if (ctx->caps().reports_qp_state) {
    EXPECT_EQ(qp->state(), QpState::INIT);
  }
  try {
    pd->dealloc();
    FAIL() << "PD with objects deallocated";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EBUSY);
  }
  ctx->close();
  EXPECT_TRUE(qp->destroyed());
  try {
    qp->post_recv(RecvWr{});
    FAIL() << "post after close accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EBADF);
  }
}

}  // namespace
}  // namespace rdmalab::verbs
