#include "verbs/context.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace rdmalab::verbs {
namespace {

TEST(DriverName, FromSysfsLinkElseFromDeviceName) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(::testing::TempDir()) / "rdmalab_sysfs";
  fs::remove_all(root);
  fs::create_directories(root / "mlx5_0" / "device");
  fs::create_directories(root / "drivers" / "mlx5_core");
  fs::create_directory_symlink(root / "drivers" / "mlx5_core",
                               root / "mlx5_0" / "device" / "driver");
  EXPECT_EQ(driver_name("mlx5_0", root.string()), "mlx5_core");
  EXPECT_EQ(driver_name("rxe0", root.string()), "rxe");
  EXPECT_EQ(driver_name("siw_eth0", root.string()), "siw");
  fs::remove_all(root);
}

}  // namespace
}  // namespace rdmalab::verbs
