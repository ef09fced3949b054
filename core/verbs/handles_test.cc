#include "verbs/handles.h"

#include <gtest/gtest.h>

namespace rdmalab::verbs {
namespace {

int fake_destroys = 0;
int fake_destroy_rc = 0;
int fake_destroy(int* p) {
  ++fake_destroys;
  return fake_destroy_rc;
}

class HandleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_destroys = 0;
    fake_destroy_rc = 0;
  }
  int obj_ = 0;
};

TEST_F(HandleTest, UseAfterDestroyIsEbadf) {
  Handle<int> h(&obj_, "ibv_destroy_fake", fake_destroy);
  EXPECT_EQ(h.get("ibv_use"), &obj_);
  h.destroy();
  EXPECT_EQ(fake_destroys, 1);
  EXPECT_FALSE(h.live());
  try {
    h.get("ibv_post_send");
    FAIL() << "no EBADF";
  } catch (const Error& e) {
    EXPECT_EQ(e.verb(), "ibv_post_send");
    EXPECT_EQ(e.err(), EBADF);
  }
  EXPECT_THROW(h.destroy(), Error);  // a second destroy is EBADF too, not a second call
  EXPECT_EQ(fake_destroys, 1);
}

TEST_F(HandleTest, FailedDestroyKeepsTheObjectAndReportsErrno) {
  Handle<int> h(&obj_, "ibv_destroy_cq", fake_destroy);
  fake_destroy_rc = EBUSY;
  try {
    h.destroy();
    FAIL() << "no EBUSY";
  } catch (const Error& e) {
    EXPECT_EQ(e.verb(), "ibv_destroy_cq");
    EXPECT_EQ(e.err(), EBUSY);
  }
  EXPECT_TRUE(h.live());
  fake_destroy_rc = 0;
  h.destroy();
  EXPECT_FALSE(h.live());
}

TEST_F(HandleTest, DestructorAndMoveDestroyOnce) {
  {
    Handle<int> a(&obj_, "d", fake_destroy);
    Handle<int> b = std::move(a);
    EXPECT_FALSE(a.live());  // NOLINT(bugprone-use-after-move): moved-from is empty by design
    EXPECT_TRUE(b.live());
  }
  EXPECT_EQ(fake_destroys, 1);
}

TEST(CheckRc, PositiveErrnoAndMinusOneWithErrno) {
  EXPECT_NO_THROW(check_rc("v", 0));
  try {
    check_rc("ibv_modify_qp", EINVAL, "x");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EINVAL);
    EXPECT_EQ(e.detail(), "x");
  }
  errno = EAGAIN;
  try {
    check_rc("ibv_post_send", -1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EAGAIN);
  }
}

TEST(CheckPtr, NullIsErrorWithErrnoOrEio) {
  errno = ENOMEM;
  try {
    check_ptr<int>("ibv_alloc_pd", nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.verb(), "ibv_alloc_pd");
    EXPECT_EQ(e.err(), ENOMEM);
  }
  errno = 0;
  try {
    check_ptr<int>("ibv_create_cq", nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), EIO);
  }
}

}  // namespace
}  // namespace rdmalab::verbs
