#include "verbs/handles.h"

#include <cstdlib>
#include <cstring>

namespace rdmalab::verbs {

namespace {
constexpr uint64_t kPageBytes = 4096;

// Adapters to the Destroyer convention: 0 or an errno.
int close_device(ibv_context* c) {
  return ibv_close_device(c) == 0 ? 0 : last_errno();
}
int dealloc_pd(ibv_pd* p) {
  return ibv_dealloc_pd(p);
}
int dereg_mr(ibv_mr* m) {
  return ibv_dereg_mr(m);
}
int destroy_cq(ibv_cq* c) {
  return ibv_destroy_cq(c);
}
int destroy_srq(ibv_srq* s) {
  return ibv_destroy_srq(s);
}
int close_xrcd(ibv_xrcd* x) {
  return ibv_close_xrcd(x);
}
int destroy_qp(ibv_qp* q) {
  return ibv_destroy_qp(q);
}
int destroy_ah(ibv_ah* a) {
  return ibv_destroy_ah(a);
}
int destroy_channel(rdma_event_channel* ch) {
  rdma_destroy_event_channel(ch);
  return 0;
}
int destroy_id(rdma_cm_id* id) {
  return rdma_destroy_id(id) == 0 ? 0 : last_errno();
}
}  // namespace

int last_errno() {
  return errno != 0 ? errno : EIO;
}

void check_rc(const std::string& verb, int rc, const std::string& detail) {
  if (rc == 0) return;
  throw Error(verb, rc > 0 ? rc : last_errno(), detail);
}

DeviceList get_device_list(int* count) {
  errno = 0;
  ibv_device** list = ibv_get_device_list(count);
  // No device is not an error: libibverbs returns an empty list (or NULL with ENOSYS when
  // the uverbs module is missing).
  if (list == nullptr && errno != ENOSYS) throw Error("ibv_get_device_list", last_errno(), "");
  if (list == nullptr) *count = 0;
  return {list, [](ibv_device** l) {
            if (l != nullptr) ibv_free_device_list(l);
          }};
}

Handle<ibv_context> open_device(ibv_device* dev) {
  errno = 0;
  return {check_ptr("ibv_open_device", ibv_open_device(dev), ibv_get_device_name(dev)),
          "ibv_close_device", close_device};
}

Handle<ibv_pd> alloc_pd(ibv_context* ctx) {
  errno = 0;
  return {check_ptr("ibv_alloc_pd", ibv_alloc_pd(ctx)), "ibv_dealloc_pd", dealloc_pd};
}

Handle<ibv_cq> create_cq(ibv_context* ctx, int cqe) {
  errno = 0;
  return {check_ptr("ibv_create_cq", ibv_create_cq(ctx, cqe, nullptr, nullptr, 0),
                    "cqe " + std::to_string(cqe)),
          "ibv_destroy_cq", destroy_cq};
}

Handle<ibv_srq> create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  errno = 0;
  return {check_ptr("ibv_create_srq", ibv_create_srq(pd, attr)), "ibv_destroy_srq", destroy_srq};
}

Handle<ibv_srq> create_srq_ex(ibv_context* ctx, ibv_srq_init_attr_ex* attr) {
  errno = 0;
  return {check_ptr("ibv_create_srq_ex", ibv_create_srq_ex(ctx, attr)), "ibv_destroy_srq",
          destroy_srq};
}

Handle<ibv_xrcd> open_xrcd(ibv_context* ctx, int fd, int oflags) {
  ibv_xrcd_init_attr attr{};
  attr.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  attr.fd = fd;
  attr.oflags = oflags;
  errno = 0;
  return {check_ptr("ibv_open_xrcd", ibv_open_xrcd(ctx, &attr)), "ibv_close_xrcd", close_xrcd};
}

Handle<ibv_qp> create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  errno = 0;
  return {check_ptr("ibv_create_qp", ibv_create_qp(pd, attr)), "ibv_destroy_qp", destroy_qp};
}

Handle<ibv_qp> create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* attr) {
  errno = 0;
  return {check_ptr("ibv_create_qp_ex", ibv_create_qp_ex(ctx, attr)), "ibv_destroy_qp", destroy_qp};
}

Handle<ibv_qp> open_qp(ibv_context* ctx, ibv_qp_open_attr* attr) {
  errno = 0;
  return {check_ptr("ibv_open_qp", ibv_open_qp(ctx, attr), "qpn " + std::to_string(attr->qp_num)),
          "ibv_destroy_qp", destroy_qp};
}

Handle<ibv_ah> create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  errno = 0;
  return {check_ptr("ibv_create_ah", ibv_create_ah(pd, attr)), "ibv_destroy_ah", destroy_ah};
}

Handle<rdma_event_channel> create_event_channel() {
  errno = 0;
  return {check_ptr("rdma_create_event_channel", rdma_create_event_channel()),
          "rdma_destroy_event_channel", destroy_channel};
}

Handle<rdma_cm_id> create_id(rdma_event_channel* ch, void* context, rdma_port_space ps) {
  rdma_cm_id* id = nullptr;
  errno = 0;
  if (rdma_create_id(ch, &id, context, ps) != 0) throw Error("rdma_create_id", last_errno(), "");
  return {id, "rdma_destroy_id", destroy_id};
}

void MrBuffer::Free::operator()(uint8_t* p) const {
  std::free(p);
}

MrBuffer::MrBuffer(ibv_pd* pd, uint64_t length, int access) : length_(length) {
  if (length == 0) throw Error("ibv_reg_mr", EINVAL, "length 0");
  const uint64_t rounded = (length + kPageBytes - 1) / kPageBytes * kPageBytes;
  buf_.reset(static_cast<uint8_t*>(std::aligned_alloc(kPageBytes, rounded)));
  if (!buf_) throw Error("ibv_reg_mr", ENOMEM, "buffer of " + std::to_string(rounded) + " bytes");
  std::memset(buf_.get(), 0, rounded);
  errno = 0;
  mr_ = Handle<ibv_mr>(check_ptr("ibv_reg_mr", ibv_reg_mr(pd, buf_.get(), length, access),
                                 "length " + std::to_string(length)),
                       "ibv_dereg_mr", dereg_mr);
}

}  // namespace rdmalab::verbs
