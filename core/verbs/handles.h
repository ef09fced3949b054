// RAII owners of libibverbs / librdmacm objects. Every create is checked and a failure thrown
// as rdmalab::Error(verb, errno, detail); using a handle after destroy throws Error(verb,
// EBADF). destroy() reports the provider's errno (EBUSY while in use) and keeps the object;
// the destructor is the best-effort fallback for paths that already threw.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "rdmalab/error.h"

namespace rdmalab::verbs {

// Returns errno for a failed create (some providers fail without setting it).
int last_errno();
// rc convention of ibv_destroy_*, ibv_modify_*, ibv_post_*: 0 or a positive errno; a few
// providers return -1 with errno set.
void check_rc(const std::string& verb, int rc, const std::string& detail = "");

template <class T>
T* check_ptr(const std::string& verb, T* p, const std::string& detail = "") {
  if (p == nullptr) throw Error(verb, last_errno(), detail);
  return p;
}

template <class T>
class Handle {
 public:
  using Destroyer = std::function<int(T*)>;  // returns 0 or an errno

  Handle() = default;
  Handle(T* p, std::string destroy_verb, Destroyer d)
      : p_(p), destroy_verb_(std::move(destroy_verb)), destroyer_(std::move(d)) {}
  ~Handle() {
    if (p_ != nullptr) destroyer_(p_);
  }
  Handle(Handle&& o) noexcept { *this = std::move(o); }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      if (p_ != nullptr) destroyer_(p_);
      p_ = std::exchange(o.p_, nullptr);
      destroy_verb_ = std::move(o.destroy_verb_);
      destroyer_ = std::move(o.destroyer_);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  // The live object for verb; EBADF once destroyed.
  T* get(const std::string& verb) const {
    if (p_ == nullptr) throw Error(verb, EBADF, "object already destroyed");
    return p_;
  }
  T* raw() const noexcept { return p_; }
  bool live() const noexcept { return p_ != nullptr; }

  // Best effort, errors ignored: for release paths (close, process exit, destructors).
  void reset() noexcept {
    if (p_ != nullptr) destroyer_(p_);
    p_ = nullptr;
  }

  void destroy() {
    T* p = get(destroy_verb_);
    check_rc(destroy_verb_, destroyer_(p));
    p_ = nullptr;
  }

 private:
  T* p_ = nullptr;
  std::string destroy_verb_;
  Destroyer destroyer_;
};

using DeviceList = std::unique_ptr<ibv_device*, void (*)(ibv_device**)>;
DeviceList get_device_list(int* count);

Handle<ibv_context> open_device(ibv_device* dev);
Handle<ibv_pd> alloc_pd(ibv_context* ctx);
Handle<ibv_cq> create_cq(ibv_context* ctx, int cqe);
Handle<ibv_srq> create_srq(ibv_pd* pd, ibv_srq_init_attr* attr);
Handle<ibv_srq> create_srq_ex(ibv_context* ctx, ibv_srq_init_attr_ex* attr);
// fd -1 for a process-private domain.
Handle<ibv_xrcd> open_xrcd(ibv_context* ctx, int fd, int oflags);
Handle<ibv_qp> create_qp(ibv_pd* pd, ibv_qp_init_attr* attr);
Handle<ibv_qp> create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* attr);
Handle<ibv_qp> open_qp(ibv_context* ctx, ibv_qp_open_attr* attr);
Handle<ibv_ah> create_ah(ibv_pd* pd, ibv_ah_attr* attr);
Handle<rdma_event_channel> create_event_channel();
Handle<rdma_cm_id> create_id(rdma_event_channel* ch, void* context, rdma_port_space ps);

// A registered buffer: the page-aligned memory it owns outlives the registration.
class MrBuffer {
 public:
  MrBuffer(ibv_pd* pd, uint64_t length, int access);
  ibv_mr* get(const std::string& verb) const { return mr_.get(verb); }
  bool live() const { return mr_.live(); }
  uint8_t* data() const { return buf_.get(); }
  uint64_t length() const { return length_; }
  void dereg() { mr_.destroy(); }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  uint64_t length_;
  std::unique_ptr<uint8_t, Free> buf_;
  Handle<ibv_mr> mr_;  // declared last: deregistered before the buffer is freed
};

}  // namespace rdmalab::verbs
