// The ledger alone, no backend: outcomes, implied unsignaled WRs, and one test per violation.
#include "stack/ledger.h"

#include <gtest/gtest.h>

#include "rdmalab/error.h"

namespace rdmalab::stack {
namespace {

WorkCompletion wc(uint64_t wr_id, uint32_t qp_num, WcStatus status = WcStatus::SUCCESS) {
  WorkCompletion c;
  c.wr_id = wr_id;
  c.qp_num = qp_num;
  c.status = status;
  return c;
}

TEST(LedgerTest, EveryOutcomeCounted) {
  CompletionLedger ledger;
  ledger.on_post("qp:1", 17, WorkQueue::SQ, 1);
  ledger.on_post("qp:1", 17, WorkQueue::SQ, 2);
  ledger.on_post("qp:1", 17, WorkQueue::RQ, 3);
  ledger.on_post("qp:1", 17, WorkQueue::RQ, 4);
  ledger.on_completion(wc(1, 17));
  ledger.on_completion(wc(2, 17, WcStatus::RETRY_EXC_ERR));
  ledger.on_completion(wc(3, 17, WcStatus::WR_FLUSH_ERR));
  const LedgerReport r = ledger.check();
  EXPECT_EQ(r.posted, 4u);
  EXPECT_EQ(r.succeeded, 1u);
  EXPECT_EQ(r.errored, 1u);
  EXPECT_EQ(r.flushed, 1u);
  EXPECT_EQ(r.unknown, 1u);
  EXPECT_EQ(r.unknown_wr_ids, std::vector<uint64_t>{4});
  EXPECT_TRUE(r.violations.empty());
  EXPECT_FALSE(r.exactly_once());
  EXPECT_EQ(ledger.outstanding(17, WorkQueue::RQ), 1u);
  EXPECT_EQ(ledger.outstanding("qp:1", WorkQueue::SQ), 0u);
}

TEST(LedgerTest, UnsignaledImpliedByLaterSuccess) {
  CompletionLedger ledger;
  ledger.on_post("qp:1", 17, WorkQueue::SQ, 1, false);
  ledger.on_post("qp:1", 17, WorkQueue::SQ, 2, false);
  ledger.on_post("qp:1", 17, WorkQueue::SQ, 3, true);
  EXPECT_EQ(ledger.outstanding(17, WorkQueue::SQ), 3u);
  ledger.on_completion(wc(3, 17));
  const LedgerReport r = ledger.check();
  EXPECT_EQ(r.implied, 2u);
  EXPECT_EQ(r.succeeded, 1u);
  EXPECT_TRUE(r.exactly_once());
  EXPECT_EQ(ledger.entry(1)->outcome, WrOutcome::IMPLIED);
}

TEST(LedgerTest, UnsignaledPassedByLaterFlushIsUnknown) {
  CompletionLedger ledger;
  ledger.on_post("qp:1", 17, WorkQueue::SQ, 1, false);
  ledger.on_post("qp:1", 17, WorkQueue::SQ, 2, true);
  ledger.on_completion(wc(2, 17, WcStatus::WR_FLUSH_ERR));
  const LedgerReport r = ledger.check();
  EXPECT_EQ(r.unknown, 1u);  // it may have succeeded or been flushed without a CQE
  EXPECT_EQ(ledger.entry(1)->outcome, WrOutcome::PASSED);
  EXPECT_EQ(ledger.outstanding(17, WorkQueue::SQ), 0u);  // no completion can still come
  EXPECT_TRUE(r.violations.empty());
}

TEST(LedgerTest, DuplicateCompletion) {
  CompletionLedger ledger;
  ledger.on_post("qp:1", 17, WorkQueue::SQ, 7);
  ledger.on_completion(wc(7, 17));
  ledger.on_completion(wc(7, 17, WcStatus::WR_FLUSH_ERR));
  const auto v = ledger.check().violations;
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, ViolationKind::DUPLICATE_COMPLETION);
  EXPECT_EQ(v[0].wr_id, 7u);
  EXPECT_EQ(ledger.check().succeeded, 1u);  // the first completion stands
}

TEST(LedgerTest, UnknownWrId) {
  CompletionLedger ledger;
  ledger.on_completion(wc(99, 17));
  const auto v = ledger.check().violations;
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, ViolationKind::UNKNOWN_WR_ID);
  EXPECT_EQ(v[0].wr_id, 99u);
}

TEST(LedgerTest, ForgottenPostIsUnknownWrId) {
  CompletionLedger ledger;
  ledger.on_post("qp:1", 17, WorkQueue::SQ, 5);
  ledger.forget(5);
  EXPECT_EQ(ledger.check().posted, 0u);
  ledger.on_completion(wc(5, 17));
  ASSERT_EQ(ledger.violations().size(), 1u);
  EXPECT_EQ(ledger.violations()[0].kind, ViolationKind::UNKNOWN_WR_ID);
}

TEST(LedgerTest, WrongQp) {
  CompletionLedger ledger;
  ledger.on_post("qp:1", 17, WorkQueue::RQ, 3);
  ledger.on_completion(wc(3, 18));
  const auto v = ledger.check().violations;
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, ViolationKind::WRONG_QP);
  EXPECT_EQ(v[0].wr_id, 3u);
  EXPECT_EQ(v[0].qp_num, 18u);
}

TEST(LedgerTest, SrqCompletionOnAttachedQpOnly) {
  CompletionLedger ledger;
  ledger.attach_srq("srq:4", 17);
  ledger.attach_srq("srq:4", 19);
  ledger.on_post("srq:4", 2, WorkQueue::SRQ, 1);
  ledger.on_post("srq:4", 2, WorkQueue::SRQ, 2);
  ledger.on_post("srq:4", 2, WorkQueue::SRQ, 3);
  ledger.on_completion(wc(2, 19));  // SRQ order is not checked: shared by QPs
  ledger.on_completion(wc(1, 17));
  ledger.on_completion(wc(3, 20));
  const auto v = ledger.check().violations;
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, ViolationKind::WRONG_QP);
  EXPECT_EQ(v[0].wr_id, 3u);
}

TEST(LedgerTest, OutOfOrderWithinWorkQueue) {
  CompletionLedger ledger;
  ledger.on_post("qp:1", 17, WorkQueue::SQ, 1);
  ledger.on_post("qp:1", 17, WorkQueue::SQ, 2);
  ledger.on_post("qp:1", 17, WorkQueue::RQ, 3);
  ledger.on_completion(wc(3, 17));  // another work queue: no order relation
  ledger.on_completion(wc(2, 17, WcStatus::WR_FLUSH_ERR));
  ledger.on_completion(wc(1, 17, WcStatus::WR_FLUSH_ERR));
  const auto v = ledger.check().violations;
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, ViolationKind::OUT_OF_ORDER);
  EXPECT_EQ(v[0].wr_id, 2u);
  EXPECT_EQ(ledger.check().flushed, 2u);
}

TEST(LedgerTest, CompletionForImpliedWrIsOutOfOrder) {
  CompletionLedger ledger;
  ledger.on_post("qp:1", 17, WorkQueue::SQ, 1, false);
  ledger.on_post("qp:1", 17, WorkQueue::SQ, 2, true);
  ledger.on_completion(wc(2, 17));
  ledger.on_completion(wc(1, 17, WcStatus::LOC_PROT_ERR));
  const auto v = ledger.check().violations;
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, ViolationKind::OUT_OF_ORDER);
  EXPECT_EQ(v[0].wr_id, 1u);
}

TEST(LedgerTest, ViolationsRecordedInHistory) {
  TimeNs now = 5;
  History history([&now] { return now; });
  CompletionLedger ledger(&history, "server");
  ledger.on_completion(wc(42, 17));
  const auto records = history.snapshot();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].kind, "ledger_violation");
  EXPECT_EQ(records[0].host, "server");
  EXPECT_EQ(records[0].data.at("violation"), "unknown_wr_id");
  EXPECT_EQ(records[0].data.at("wr_id"), 42);
}

TEST(LedgerTest, PostRejectsReusedAndZeroWrId) {
  CompletionLedger ledger;
  ledger.on_post("qp:1", 17, WorkQueue::SQ, 1);
  try {
    ledger.on_post("qp:2", 18, WorkQueue::SQ, 1);
    FAIL() << "reused wr_id accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EEXIST);
  }
  try {
    ledger.on_post("qp:2", 18, WorkQueue::SQ, 0);
    FAIL() << "wr_id 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EINVAL);
  }
}

}  // namespace
}  // namespace rdmalab::stack
