// Shared by the verbs backend's tests: whether this machine has an RDMA device.
#pragma once

#include <filesystem>

namespace rdmalab::verbs::testing {

// Any device in sysfs (what ibv_get_device_list reads).
inline bool sysfs_has_rdma_device() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path root = "/sys/class/infiniband";
  return fs::is_directory(root, ec) && fs::directory_iterator(root, ec) != fs::directory_iterator();
}

// A device in sysfs and the uverbs character devices to reach it (a container may show the
// first without the second).
inline bool have_rdma_device() {
  std::error_code ec;
  return sysfs_has_rdma_device() && std::filesystem::is_directory("/dev/infiniband", ec);
}

#define RDMALAB_REQUIRE_DEVICE()                      \
  if (!::rdmalab::verbs::testing::have_rdma_device()) \
  GTEST_SKIP() << "no RDMA device (/sys/class/infiniband is empty)"

}  // namespace rdmalab::verbs::testing
