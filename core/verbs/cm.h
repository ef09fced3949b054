// rdma_cm over librdmacm. A channel reads rdma_get_cm_event on its nonblocking fd from its
// own thread, maps each event's rdma_cm_id back to the engine id (a CONNECT_REQUEST brings a
// new id), and holds the raw event until the engine acks it: rdma_destroy_id waits for those
// acks, so destroy checks them first and throws EBUSY at its deadline instead.
//
// cm_state() is the engine's view (updated by our verbs and the events read), not the
// kernel's; protocol_state() is "unknown": neither is visible through librdmacm.
#pragma once

#include <rdma/rdma_cma.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "rdmalab/cm.h"
#include "rdmalab/history.h"
#include "verbs/handles.h"
#include "verbs/objects.h"
#include "verbs/wake_fd.h"

namespace rdmalab::verbs {

class VerbsCmId;
class VerbsContext;

// librdmacm's RDMA_CM_EVENT_* as CmEventType; nullopt for events the engine does not model.
// An int: a newer librdmacm's event number may lie outside rdma_cm_event_type's range, and
// such a value held in the enum type is undefined behaviour (clang's -fsanitize=enum).
std::optional<CmEventType> cm_event_from_rdma(int event);

// The one VerbsContext per librdmacm-opened ibv_context in this process.
std::shared_ptr<VerbsContext> cm_context(ibv_context* verbs, History* history,
                                         const std::string& host);
// Lab shutdown: releases what was created on those contexts and stops their event threads
// (librdmacm itself keeps the devices open).
void close_cm_contexts();

class VerbsCmEventChannel final : public CmEventChannel,
                                  public std::enable_shared_from_this<VerbsCmEventChannel> {
 public:
  VerbsCmEventChannel(History* history, std::string host);
  ~VerbsCmEventChannel() override;
  void start();  // the event thread; once, after construction

  uint64_t id() const override { return id_; }
  bool destroyed() const override { return !ch_.live(); }
  std::string label() const override { return label_; }
  Owner owner() const override { return {history_, id_, label_, host_}; }

  std::shared_ptr<CmId> create_id() override;
  std::optional<CmEvent> get_event(TimeNs deadline_ns) override;
  void interrupt_get_event() override;
  void ack_event(const CmEvent& ev) override;
  std::shared_ptr<CmId> find_id(uint64_t id_object) const override;
  void destroy() override;

  // Lab shutdown: ends every id without waiting for acks, then the channel.
  void release() noexcept;

  // --- for the ids
  History* history() const { return history_; }
  const std::string& host() const { return host_; }
  // Waits until every event read for id was acked (false at the deadline), then unlinks the
  // id: its unread events and later arrivals are acked and dropped, and the new ids of its
  // unread CONNECT_REQUESTs are destroyed.
  bool begin_destroy(uint64_t id, TimeNs deadline_ns);
  uint64_t unacked(uint64_t id) const;
  void record(const std::string& object, const std::string& kind, nlohmann::json data) const;

 private:
  struct Held {
    CmEvent ev;
    uint64_t owner = 0;  // whose acks rdma_destroy_id waits for (the listener on CONNECT_REQUEST)
    rdma_cm_event* raw = nullptr;
  };
  void loop();
  void deliver(rdma_cm_event* raw);
  void stop_thread();

  History* history_;
  std::string host_;
  uint64_t id_;
  std::string label_;
  Handle<rdma_event_channel> ch_;
  WakeFd wake_;  // ends the thread's poll at stop
  std::thread thread_;
  std::atomic<bool> stop_{false};
  bool interrupted_ = false;  // under mu_: interrupt_get_event came

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<rdma_cm_id*, std::shared_ptr<VerbsCmId>> by_raw_;
  std::map<uint64_t, std::shared_ptr<VerbsCmId>> by_id_;
  std::deque<Held> unread_;
  std::map<uint64_t, Held> read_;  // by seq
  std::map<uint64_t, uint64_t> reported_, completed_;
  uint64_t next_seq_ = 1;
};

class VerbsCmId final : public CmId {
 public:
  // Adopts id (from rdma_create_id, or the new id of a CONNECT_REQUEST).
  VerbsCmId(std::shared_ptr<VerbsCmEventChannel> ch, Handle<rdma_cm_id> id, std::string state);
  ~VerbsCmId() override;

  uint64_t id() const override { return id_; }
  bool destroyed() const override { return !cm_.live(); }
  std::string label() const override { return label_; }
  Owner owner() const override { return ch_->owner(); }  // made through its event channel

  std::string cm_state() const override;
  std::string protocol_state() const override { return "unknown"; }
  void resolve_addr(const std::string& dst, uint16_t port, TimeNs timeout_ns) override;
  void resolve_route(TimeNs timeout_ns) override;
  void listen(uint16_t port, int backlog) override;
  std::shared_ptr<Context> context() const override;
  std::shared_ptr<Qp> create_qp(Pd& pd, const QpInitAttr& attr) override;
  std::shared_ptr<Qp> qp() const override;
  void set_timing(const CmTiming& timing) override;
  void connect(const ConnParam& param) override;
  void accept(const ConnParam& param) override;
  void reject(const std::vector<uint8_t>& private_data) override;
  void disconnect() override;
  void destroy(TimeNs deadline_ns) override;

  // --- for the channel
  rdma_cm_id* raw() const { return cm_.raw(); }
  void on_event(CmEventType type);  // the engine's cm_state after an event is read
  void release() noexcept;

 private:
  void set_state(const std::string& s);
  void recorded(const std::string& verb, nlohmann::json data = nlohmann::json::object()) const;

  std::shared_ptr<VerbsCmEventChannel> ch_;
  uint64_t id_;
  std::string label_;
  Handle<rdma_cm_id> cm_;
  std::shared_ptr<std::atomic<bool>> live_ = std::make_shared<std::atomic<bool>>(true);
  mutable std::mutex mu_;
  std::string state_;
  mutable std::shared_ptr<Context> ctx_;  // looked up on first use
  std::shared_ptr<Qp> qp_;
};

}  // namespace rdmalab::verbs
