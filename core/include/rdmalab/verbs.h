// The engine API: the verbs objects a scenario uses, as abstract classes implemented by the
// model (core/model) and by libibverbs (core/verbs). Names follow libibverbs. Every object
// has an engine id that is never reused (like uverbs' user_handle) beside its wire number
// (QPN, SRQN) that a device may hand out again.
//
// Errors: every verb throws rdmalab::Error carrying the verb name ("ibv_modify_qp") and the
// errno the kernel or provider returns. Using an object after destroy, or after its owning
// process was killed, throws Error(verb, EBADF). Nothing here blocks without a deadline.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmalab/error.h"
#include "rdmalab/types.h"

namespace rdmalab {

class Context;
class Pd;
class Cq;
class Srq;
class Xrcd;

// Where an object was made: the context (verbs objects) or event channel (cm ids) it came
// through, with that one's host and lab; a context or a channel is its own owner. A uverbs or
// ucma handle means nothing outside the file that made it, so every API that takes an object
// checks it was made where it is used (check_owner below).
struct Owner {
  const void* lab = nullptr;  // the lab's identity: compared, never dereferenced
  uint64_t id = 0;            // engine id of the context or channel; 0: a host as a whole
  std::string label;          // "ctx:3", "cm_channel:5"; "" for a host as a whole
  std::string host;
};

class Object {
 public:
  virtual ~Object() = default;
  virtual uint64_t id() const = 0;
  virtual bool destroyed() const = 0;
  // "qp:7" etc.: the name the history uses for this object.
  virtual std::string label() const = 0;
  // The context or channel it was made through (a destroyed object still says).
  virtual Owner owner() const = 0;
};

// The kind an object's label names: "qp" for "qp:7".
inline std::string object_kind(const Object& obj) {
  std::string label = obj.label();
  return label.substr(0, label.find(':'));
}

// The one error for an object used through a context, channel or host it was not made
// through: Error(verb, EINVAL, "<kind> <label> is of <ctx:3> on host <a>, not of <ctx:9> on
// host <b>") ("not of host b" where a host as a whole is the scope; "... (another lab)" when
// the labels match across labs). kind is the object's role in the call: "pd", "send_cq",
// "srq", "xrcd", "qp", "cm_id", ...
Error foreign_object_error(const std::string& verb, const std::string& kind,
                           const std::string& label, const Owner& of, const Owner& where);
// Throws foreign_object_error unless obj was made through `where`: the same context or channel
// (where.id != 0), or anything on where.host (where.id == 0, host set; nothing if unset).
void check_owner(const Owner& where, const Object& obj, const std::string& verb,
                 const std::string& kind);
// The same, through an object: a context or channel (itself), or any object (its owner).
inline void check_owner(const Object& through, const Object& obj, const std::string& verb,
                        const std::string& kind) {
  check_owner(through.owner(), obj, verb, kind);
}

class Pd : public Object {
 public:
  virtual void dealloc() = 0;  // ibv_dealloc_pd; EBUSY while objects use it
};

class Mr : public Object {
 public:
  virtual uint32_t lkey() const = 0;
  virtual uint32_t rkey() const = 0;
  virtual uint64_t addr() const = 0;  // base for Sge::addr and SendWr::remote_addr
  virtual uint64_t length() const = 0;
  virtual std::vector<uint8_t> read(uint64_t offset, uint64_t len) const = 0;
  virtual void write(uint64_t offset, const std::vector<uint8_t>& bytes) = 0;
  virtual void dereg() = 0;  // ibv_dereg_mr
};

class Cq : public Object {
 public:
  virtual int cqe() const = 0;
  // ibv_poll_cq: up to max completions, oldest first; never blocks.
  virtual std::vector<WorkCompletion> poll(int max) = 0;
  // ibv_destroy_cq; EBUSY while a QP or SRQ uses it. Waits, as rdma-core does, until every
  // async event read for the CQ was acked; EBUSY where that has not happened by the deadline.
  virtual void destroy(TimeNs deadline_ns) = 0;
};

class Srq : public Object {
 public:
  virtual uint32_t srq_num() const = 0;  // XRC SRQs: the number senders put in remote_srqn
  virtual bool is_xrc() const = 0;
  virtual void post_recv(const RecvWr& wr) = 0;
  virtual void arm_limit(uint32_t srq_limit) = 0;  // ibv_modify_srq(IBV_SRQ_LIMIT)
  virtual uint32_t limit() const = 0;
  virtual uint32_t outstanding() const = 0;      // receive WQEs posted and not consumed
  virtual void destroy(TimeNs deadline_ns) = 0;  // ibv_destroy_srq; waits for acks (see Qp)
};

class Xrcd : public Object {
 public:
  virtual void close() = 0;  // ibv_close_xrcd; destroyed on the last reference
};

struct QpInitAttr {
  QpType qp_type = QpType::RC;
  std::shared_ptr<Pd> pd;  // none for XRC_RECV
  std::shared_ptr<Cq> send_cq;
  std::shared_ptr<Cq> recv_cq;
  std::shared_ptr<Srq> srq;
  std::shared_ptr<Xrcd> xrcd;  // XRC_RECV only
  QpCap cap;
  bool sq_sig_all = false;
};

class Qp : public Object {
 public:
  virtual uint32_t qp_num() const = 0;
  virtual QpType qp_type() const = 0;
  virtual QpState state() const = 0;
  virtual void modify(const QpAttr& attr, uint32_t attr_mask) = 0;  // ibv_modify_qp
  virtual QpAttr query() const = 0;                                 // ibv_query_qp
  virtual void post_send(const SendWr& wr) = 0;                     // ibv_post_send
  virtual void post_recv(const RecvWr& wr) = 0;                     // ibv_post_recv
  // ibv_destroy_qp. Like rdma-core, waits until every async event read for this QP has been
  // acked; where that does not happen by the deadline it throws Error(EBUSY) and the QP stays.
  virtual void destroy(TimeNs deadline_ns) = 0;
  // True when this handle came from ibv_open_qp (an XRC TGT QP opened by another process).
  virtual bool is_open_handle() const = 0;
  // The caps of the device it was made on (ibv_qp->context): what its provider does.
  virtual const DeviceCaps& device_caps() const = 0;
};

enum class PortState { DOWN, INIT, ARMED, ACTIVE };

class Context : public Object {
 public:
  virtual const DeviceCaps& caps() const = 0;
  virtual Gid query_gid(uint8_t port_num, int index) const = 0;
  virtual PortState query_port(uint8_t port_num) const = 0;

  virtual std::shared_ptr<Pd> alloc_pd() = 0;
  virtual std::shared_ptr<Mr> reg_mr(Pd& pd, uint64_t length, uint32_t access) = 0;
  virtual std::shared_ptr<Cq> create_cq(int cqe) = 0;
  virtual std::shared_ptr<Srq> create_srq(Pd& pd, const SrqInitAttr& attr) = 0;
  virtual std::shared_ptr<Srq> create_srq_xrc(Pd& pd, Xrcd& xrcd, Cq& cq,
                                              const SrqInitAttr& attr) = 0;
  // ibv_open_xrcd: path names the inode that lets processes share the domain ("" = fd -1);
  // o_creat / o_excl as the open(2) flags.
  virtual std::shared_ptr<Xrcd> open_xrcd(const std::string& path, bool o_creat, bool o_excl) = 0;
  virtual std::shared_ptr<Qp> create_qp(const QpInitAttr& attr) = 0;
  virtual std::shared_ptr<Qp> open_qp(Xrcd& xrcd, uint32_t qp_num) = 0;  // ibv_open_qp

  // ibv_get_async_event with a deadline: the next unread event, or nullopt at the deadline.
  // Reading an event counts it as reported on its object; destroy waits for its ack.
  virtual std::optional<AsyncEvent> get_async_event(TimeNs deadline_ns) = 0;
  // Makes the get_async_event waiting now (or the next one) return nullopt at once (as
  // CmEventChannel::interrupt_get_event).
  virtual void interrupt_get_async_event() {}
  virtual void ack_async_event(const AsyncEvent& ev) = 0;  // ibv_ack_async_event

  virtual void close() = 0;  // ibv_close_device: destroys what is left, as process exit does
};

}  // namespace rdmalab
