// The driver facts table: one row per driver, the personality that predicts each (the Python
// side's TWIN until it reads personality_of_driver), and what the table's readers derive.
#include "rdmalab/driver_facts.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

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
  EXPECT_TRUE(c.reports_qp_state);  // a real device's fact (apply_device_facts)
  EXPECT_FALSE(c.rts_needs_cm);
  apply_driver_facts(driver_facts("mana"), c);
  EXPECT_EQ(c.qpn_policy, QpnPolicy::kLifo);
}

// The QPN policy of a row where a source says it; unknown elsewhere (siw's xa_alloc takes the
// lowest free number, neither policy).
TEST(DriverFactsTest, QpnPolicy) {
  EXPECT_EQ(driver_facts("mana").qpn_policy, QpnPolicy::kLifo);
  EXPECT_EQ(driver_facts("rxe").qpn_policy, QpnPolicy::kIncrement);
  EXPECT_EQ(driver_facts("mlx5").qpn_policy, QpnPolicy::kIncrement);
  for (const char* d : {"siw", "cxgb4", "mlx4", "irdma", "bnxt_re", "hfi1"}) {
    EXPECT_EQ(driver_facts(d).qpn_policy, QpnPolicy::kUnknown) << d;
  }
}

DeviceCaps device_caps(const char* driver, Transport t, KernelRelease running) {
  DeviceCaps c;
  c.transport = t;
  const DriverFacts d = driver_facts(driver);
  apply_driver_facts(d, c);
  apply_device_facts(d, running, c);
  return c;
}

// rxe resends a refused send racily before 6.12; an unknown kernel counts as an older one.
TEST(DriverFactsTest, RefusedSendRacesByKernel) {
  EXPECT_EQ(driver_facts("rxe").refused_send_races_before, (KernelRelease{6, 12}));
  const std::pair<KernelRelease, bool> rxe[] = {
      {{6, 1}, true}, {{6, 11}, true}, {{6, 12}, false}, {{7, 2}, false}, {{}, true}};
  for (const auto& [running, races] : rxe) {
    EXPECT_EQ(device_caps("rxe", Transport::RoCE, running).refused_send_resend_races, races)
        << running.major << "." << running.minor;
  }
  for (const char* d : {"siw", "mlx5", "mana", "hfi1"}) {
    EXPECT_FALSE(device_caps(d, Transport::RoCE, {6, 1}).refused_send_resend_races) << d;
    EXPECT_FALSE(device_caps(d, Transport::RoCE, {}).refused_send_resend_races) << d;
  }
}

// siw reports the QP's state from 6.8; rows without a bound in every release.
TEST(DriverFactsTest, ReportsQpStateByKernel) {
  EXPECT_FALSE(device_caps("siw", Transport::iWARP, {6, 1}).reports_qp_state);
  EXPECT_FALSE(device_caps("siw", Transport::iWARP, {6, 7}).reports_qp_state);
  EXPECT_TRUE(device_caps("siw", Transport::iWARP, {6, 8}).reports_qp_state);
  EXPECT_TRUE(device_caps("siw", Transport::iWARP, {7, 2}).reports_qp_state);
  EXPECT_FALSE(device_caps("siw", Transport::iWARP, {}).reports_qp_state);
  EXPECT_TRUE(device_caps("rxe", Transport::RoCE, {}).reports_qp_state);
}

// A real iWARP device's QP reaches RTS only through the CM, whatever its driver.
TEST(DriverFactsTest, RtsNeedsCmOnIwarp) {
  EXPECT_TRUE(device_caps("siw", Transport::iWARP, {6, 1}).rts_needs_cm);
  EXPECT_TRUE(device_caps("cxgb4", Transport::iWARP, {6, 1}).rts_needs_cm);
  EXPECT_TRUE(device_caps("irdma", Transport::iWARP, {6, 1}).rts_needs_cm);
  EXPECT_FALSE(device_caps("irdma", Transport::RoCE, {6, 1}).rts_needs_cm);
  EXPECT_FALSE(device_caps("rxe", Transport::RoCE, {6, 1}).rts_needs_cm);
  EXPECT_FALSE(device_caps("mlx5", Transport::IB, {6, 1}).rts_needs_cm);
}

}  // namespace
}  // namespace rdmalab
