// The driver facts table: one row per driver, the personality that predicts each (the Python
// side's TWIN until it reads personality_of_driver), and what the table's readers derive.
#include "rdmalab/driver_facts.h"

#include <gtest/gtest.h>

#include <set>

namespace rdmalab {
namespace {

TEST(DriverFactsTest, OneRowPerDriver) {
  std::set<std::string> seen;
  for (const DriverFacts& d : driver_facts()) {
    EXPECT_FALSE(d.driver.empty());
    EXPECT_TRUE(seen.insert(d.driver).second) << d.driver << " has two rows";
  }
  for (const char* d : {"rxe", "siw", "cxgb4", "mlx5", "mana", "irdma", "bnxt_re"}) {
    EXPECT_TRUE(seen.count(d)) << d;
  }
}

TEST(DriverFactsTest, PersonalityOfDriver) {
  const std::pair<const char*, const char*> twin[] = {
      {"rxe", "roce"}, {"siw", "iwarp-siw"},     {"mlx5", "ib"},
      {"mlx4", "ib"},  {"cxgb4", "iwarp-cxgb4"}, {"mana", "mana"}};
  for (const auto& [driver, personality] : twin) {
    EXPECT_EQ(personality_of_driver(driver), std::optional<std::string>(personality)) << driver;
  }
  EXPECT_EQ(personality_of_driver("irdma"), std::nullopt);  // a row, no personality yet
  EXPECT_EQ(personality_of_driver("hfi1"), std::nullopt);   // no row
}

TEST(DriverFactsTest, UnknownDriverGetsDefaults) {
  const DriverFacts d = driver_facts("hfi1");
  EXPECT_EQ(d.driver, "hfi1");
  EXPECT_FALSE(d.err_post.has_value());
  EXPECT_FALSE(d.disassociates);
  EXPECT_TRUE(d.raises.empty());
  EXPECT_EQ(err_post_of(d, Transport::IB), ErrPostPolicy::kFlush);
  EXPECT_EQ(err_post_of(d, Transport::RoCE), ErrPostPolicy::kFlush);
  EXPECT_EQ(err_post_of(d, Transport::iWARP), ErrPostPolicy::kRefuse);
}

// A real device reports raises only where they were checked, with the unsettled claims.
TEST(DriverFactsTest, DeviceRaises) {
  EXPECT_EQ(device_raises(driver_facts("rxe")), driver_facts("rxe").raises);
  const auto siw = device_raises(driver_facts("siw"));
  EXPECT_EQ(siw.size(), driver_facts("siw").raises.size() + 1);
  EXPECT_EQ(siw.back(), AsyncEventType::DEVICE_FATAL);
  EXPECT_FALSE(driver_facts("mlx5").raises.empty());
  EXPECT_TRUE(device_raises(driver_facts("mlx5")).empty());  // a reading: unknown on a device
}

TEST(DriverFactsTest, ApplyWritesTheProviderFacts) {
  DeviceCaps c;
  c.transport = Transport::iWARP;
  apply_driver_facts(driver_facts("cxgb4"), c);
  EXPECT_EQ(c.err_post, ErrPostPolicy::kRefuse);
  EXPECT_EQ(c.iw_close_timeout_s, 60);
  EXPECT_FALSE(c.disassociates);
  EXPECT_TRUE(c.raises_event(AsyncEventType::QP_ACCESS_ERR));
  apply_driver_facts(driver_facts("siw"), c);
  EXPECT_EQ(c.err_post, ErrPostPolicy::kStrand);
  EXPECT_TRUE(c.send_completes_on_handoff);
  EXPECT_TRUE(c.connect_is_synchronous);
  EXPECT_EQ(c.iw_close_timeout_s, 0);
  EXPECT_TRUE(c.reports_qp_state);  // left to the reader: it depends on the kernel
}

}  // namespace
}  // namespace rdmalab
