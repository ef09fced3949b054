// The personalities and the driver rows they predict: every personality a row names exists,
// and each personality's provider facts are its driver's row (less what the model states
// otherwise, each with its reason in personality.cc).
#include "model/personality.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>

#include "rdmalab/driver_facts.h"

namespace rdmalab::model {
namespace {

TEST(PersonalityTest, EveryPersonalityARowNamesExists) {
  const auto& names = personality_names();
  for (const DriverFacts& d : driver_facts()) {
    if (d.personality.empty()) continue;
    EXPECT_NE(std::find(names.begin(), names.end(), d.personality), names.end())
        << d.driver << " names " << d.personality;
    EXPECT_NO_THROW(personality(d.personality));
  }
}

struct Predicts {
  std::string personality;
  std::string driver;
  bool disassociates;  // the model's kernel, 6.1, where the row's is another's
};

void PrintTo(const Predicts& p, std::ostream* os) {
  *os << p.personality << " predicts " << p.driver;
}

class PersonalityFactsTest : public ::testing::TestWithParam<Predicts> {};

TEST_P(PersonalityFactsTest, CarriesItsDriversRow) {
  const DeviceCaps& c = personality(GetParam().personality).caps;
  const DriverFacts d = driver_facts(GetParam().driver);
  EXPECT_EQ(personality_of_driver(d.driver), d.personality);
  EXPECT_EQ(c.err_post, err_post_of(d, c.transport));
  EXPECT_EQ(c.retry_cnt_7_infinite, d.retry_cnt_7_infinite);
  EXPECT_EQ(c.disassociates, GetParam().disassociates);
  EXPECT_EQ(c.send_completes_on_handoff, d.send_completes_on_handoff);
  EXPECT_EQ(c.connect_is_synchronous, d.connect_is_synchronous);
  EXPECT_EQ(c.iw_close_timeout_s, d.iw_close_timeout_s);
  EXPECT_EQ(c.raises, d.raises);
  EXPECT_TRUE(c.reports_qp_state);  // the model's QPs answer ibv_query_qp
  if (d.qpn_policy != QpnPolicy::kUnknown) {
    EXPECT_EQ(c.qpn_policy, d.qpn_policy);
  }
  // A real device's facts, which no personality takes (types.h): the model's bring_up moves
  // iWARP QPs to RTS by modify, and its hosts have no stack that refuses a send.
  EXPECT_FALSE(c.rts_needs_cm);
  EXPECT_FALSE(c.refused_send_resend_races);
}

INSTANTIATE_TEST_SUITE_P(Rows, PersonalityFactsTest,
                         ::testing::Values(Predicts{"roce", "rxe", false},
                                           Predicts{"ib", "mlx5", true},
                                           Predicts{"ib-legacy", "mlx5", true},
                                           Predicts{"iwarp-cxgb4", "cxgb4", false},
                                           Predicts{"iwarp-siw", "siw", false},
                                           Predicts{"mana", "mana", false}),  // the row: 7.2 (Q3)
                         [](const auto& info) {
                           std::string n = info.param.personality;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// The facts the personalities held before the table, by value: the model's histories rest on
// them (tests/model_histories.py).
TEST(PersonalityTest, ProviderFactsAsBefore) {
  EXPECT_EQ(personality("roce").caps.err_post, ErrPostPolicy::kFlush);
  EXPECT_EQ(personality("ib").caps.err_post, ErrPostPolicy::kFlush);
  EXPECT_EQ(personality("iwarp-cxgb4").caps.err_post, ErrPostPolicy::kRefuse);
  EXPECT_EQ(personality("iwarp-siw").caps.err_post, ErrPostPolicy::kStrand);
  EXPECT_EQ(personality("mana").caps.err_post, ErrPostPolicy::kFlush);
  EXPECT_TRUE(personality("roce").caps.retry_cnt_7_infinite);
  EXPECT_EQ(personality("iwarp-cxgb4").caps.iw_close_timeout_s, 60);
  EXPECT_FALSE(personality("iwarp-siw").caps.raises_event(AsyncEventType::DEVICE_FATAL));
  EXPECT_EQ(personality("ib").caps.raises.size(), 19u);
  EXPECT_EQ(personality("mana").caps.raises, std::vector<AsyncEventType>{AsyncEventType::QP_FATAL});
  EXPECT_EQ(personality("ib-legacy").caps.xrc_tgt_lifetime, XrcTgtLifetime::kXrcd);
  EXPECT_EQ(personality("ib").caps.xrc_tgt_lifetime, XrcTgtLifetime::kHandle);
  // The QPN allocator each personality had (Personality::qpn_policy before caps carried it);
  // none is unknown: the model's allocator needs one.
  for (const char* p : {"roce", "ib", "ib-legacy", "iwarp-cxgb4", "iwarp-siw"}) {
    EXPECT_EQ(personality(p).caps.qpn_policy, QpnPolicy::kIncrement) << p;
  }
  EXPECT_EQ(personality("mana").caps.qpn_policy, QpnPolicy::kLifo);
}

}  // namespace
}  // namespace rdmalab::model
