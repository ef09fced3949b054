#include "verbs/cm.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "verbs/context.h"
#include "verbs/events.h"
#include "verbs/stall_meter.h"

namespace rdmalab::verbs {

namespace {
// A read waits on the condition variable that deliver and interrupt notify: the slice only
// bounds a wait that nobody notified (each wake-up costs a TCG guest ~0.4 ms of its vCPU).
constexpr TimeNs kWaitSliceNs = kNsPerSec;

static_assert(RDMA_CM_EVENT_ADDR_RESOLVED == 0 && RDMA_CM_EVENT_TIMEWAIT_EXIT == 15,
              "CmEventType mirrors librdmacm's order");

// Private data of events that carry it (rdma_cm_event.param.conn).
std::vector<uint8_t> private_data_of(const rdma_cm_event& e) {
  const auto* p = static_cast<const uint8_t*>(e.param.conn.private_data);
  if (p == nullptr || e.param.conn.private_data_len == 0) return {};
  return {p, p + e.param.conn.private_data_len};
}

}  // namespace

std::optional<CmEventType> cm_event_from_rdma(int v) {
  if (v < RDMA_CM_EVENT_ADDR_RESOLVED || v > RDMA_CM_EVENT_TIMEWAIT_EXIT) return std::nullopt;
  return static_cast<CmEventType>(v);
}

namespace {
struct CmContexts {
  std::mutex mu;
  std::map<ibv_context*, std::weak_ptr<VerbsContext>> by_verbs;
};
CmContexts& cm_contexts() {
  static CmContexts c;
  return c;
}
}  // namespace

std::shared_ptr<VerbsContext> cm_context(ibv_context* verbs, History* history,
                                         const std::string& host) {
  CmContexts& all = cm_contexts();
  std::lock_guard<std::mutex> lock(all.mu);
  if (auto c = all.by_verbs[verbs].lock(); c && !c->destroyed()) return c;
  auto c = std::make_shared<VerbsContext>(verbs, history, host);
  all.by_verbs[verbs] = c;
  return c;
}

void close_cm_contexts() {
  std::vector<std::shared_ptr<VerbsContext>> live;
  {
    CmContexts& all = cm_contexts();
    std::lock_guard<std::mutex> lock(all.mu);
    for (auto& [verbs, weak] : all.by_verbs) {
      if (auto c = weak.lock(); c && !c->destroyed()) live.push_back(std::move(c));
    }
    all.by_verbs.clear();
  }
  for (auto& c : live) c->close();
}

// --- channel
VerbsCmEventChannel::VerbsCmEventChannel(History* history, std::string host)
    : history_(history),
      host_(std::move(host)),
      id_(new_object_id()),
      label_("cm_channel:" + std::to_string(id_)),
      ch_(create_event_channel()) {
  const int flags = fcntl(ch_.raw()->fd, F_GETFL);
  if (flags < 0 || fcntl(ch_.raw()->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw Error("fcntl", errno, "rdma_cm channel fd O_NONBLOCK");
  }
}

VerbsCmEventChannel::~VerbsCmEventChannel() {
  release();
}

void VerbsCmEventChannel::start() {
  thread_ = std::thread([this] { loop(); });
}

void VerbsCmEventChannel::record(const std::string& object, const std::string& kind,
                                 nlohmann::json data) const {
  if (history_ != nullptr) history_->record(host_, object, kind, std::move(data));
}

void VerbsCmEventChannel::loop() {
  while (!stop_) {
    const WakeFd::Ready r = wake_.wait_readable(ch_.raw()->fd);
    if (r == WakeFd::Ready::kGone) return;  // no more events
    if (r == WakeFd::Ready::kNothing) continue;
    rdma_cm_event* raw = nullptr;
    while (!stop_ && rdma_get_cm_event(ch_.raw(), &raw) == 0) deliver(raw);
  }
}

void VerbsCmEventChannel::deliver(rdma_cm_event* raw) {
  int number = 0;  // read as an int, not loaded as the enum (cm_event_from_rdma)
  static_assert(sizeof number == sizeof raw->event);
  std::memcpy(&number, &raw->event, sizeof number);
  const std::optional<CmEventType> type = cm_event_from_rdma(number);
  std::unique_lock<std::mutex> lock(mu_);
  Held h;
  h.raw = raw;
  if (!type) {
    rdma_ack_cm_event(raw);  // ADDR_RESOLVED..TIMEWAIT_EXIT only; multicast is not modeled
    return;
  }
  h.ev.event = *type;
  h.ev.status = raw->status;
  h.ev.private_data = private_data_of(*raw);
  if (*type == CmEventType::CONNECT_REQUEST) {
    auto listener = by_raw_.find(raw->listen_id);
    if (listener == by_raw_.end()) {
      rdma_ack_cm_event(raw);
      return;
    }
    auto self = weak_from_this().lock();
    // The new id is ours from here; librdmacm made it inside rdma_get_cm_event.
    Handle<rdma_cm_id> adopted(raw->id, "rdma_destroy_id", [](rdma_cm_id* id) {
      return rdma_destroy_id(id) == 0 ? 0 : last_errno();
    });
    if (!self) {  // the channel is going away: the new id goes with the event
      rdma_ack_cm_event(raw);
      return;
    }
    auto id = std::make_shared<VerbsCmId>(self, std::move(adopted), "CONNECT");
    by_raw_[raw->id] = id;
    by_id_[id->id()] = id;
    h.ev.id = id->id();
    h.ev.listen_id = listener->second->id();
    h.owner = h.ev.listen_id;  // ucma counts the event on the listening id
  } else {
    auto it = by_raw_.find(raw->id);
    if (it == by_raw_.end()) {
      rdma_ack_cm_event(raw);  // for an id being destroyed
      return;
    }
    h.ev.id = it->second->id();
    h.owner = h.ev.id;
  }
  h.ev.seq = next_seq_++;
  unread_.push_back(std::move(h));
  lock.unlock();
  cv_.notify_all();
}

void VerbsCmEventChannel::interrupt_get_event() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    interrupted_ = true;
  }
  cv_.notify_all();
}

std::shared_ptr<CmId> VerbsCmEventChannel::create_id() {
  rdma_event_channel* ch = ch_.get("rdma_create_id");
  auto id = std::make_shared<VerbsCmId>(shared_from_this(),
                                        verbs::create_id(ch, nullptr, RDMA_PS_TCP), "IDLE");
  std::lock_guard<std::mutex> lock(mu_);
  by_raw_[id->raw()] = id;
  by_id_[id->id()] = id;
  return id;
}

std::optional<CmEvent> VerbsCmEventChannel::get_event(TimeNs deadline_ns) {
  ch_.get("rdma_get_cm_event");
  std::unique_lock<std::mutex> lock(mu_);
  const TimeNs start = monotonic_now_ns();
  while (unread_.empty()) {
    if (std::exchange(interrupted_, false)) return std::nullopt;
    const TimeNs slice = process_wait_slice_ns(start, deadline_ns, kWaitSliceNs);
    if (slice == 0) return std::nullopt;
    cv_.wait_for(lock, std::chrono::nanoseconds(slice));
  }
  Held h = std::move(unread_.front());
  unread_.pop_front();
  ++reported_[h.owner];
  read_[h.ev.seq] = h;
  std::shared_ptr<VerbsCmId> id;
  if (auto it = by_id_.find(h.ev.id); it != by_id_.end()) id = it->second;
  lock.unlock();
  if (id) id->on_event(h.ev.event);
  record(id ? id->label() : label_, "cm_event",
         {{"event", std::string(to_string(h.ev.event))},
          {"status", h.ev.status},
          {"id", h.ev.id},
          {"listen_id", h.ev.listen_id},
          {"seq", h.ev.seq}});
  return h.ev;
}

void VerbsCmEventChannel::ack_event(const CmEvent& ev) {
  ch_.get("rdma_ack_cm_event");
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = read_.find(ev.seq);
    if (it == read_.end()) {
      throw Error("rdma_ack_cm_event", EINVAL,
                  "event seq " + std::to_string(ev.seq) + " was not read or is already acked");
    }
    rdma_ack_cm_event(it->second.raw);
    ++completed_[it->second.owner];
    read_.erase(it);
  }
  cv_.notify_all();
}

std::shared_ptr<CmId> VerbsCmEventChannel::find_id(uint64_t id_object) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id_object);
  if (it == by_id_.end()) throw Error("find_id", ENOENT, "no cm id " + std::to_string(id_object));
  return it->second;
}

uint64_t VerbsCmEventChannel::unacked(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto r = reported_.find(id);
  auto c = completed_.find(id);
  return (r == reported_.end() ? 0 : r->second) - (c == completed_.end() ? 0 : c->second);
}

bool VerbsCmEventChannel::begin_destroy(uint64_t id, TimeNs deadline_ns) {
  std::unique_lock<std::mutex> lock(mu_);
  const TimeNs start = monotonic_now_ns();
  while (reported_[id] != completed_[id]) {
    const TimeNs slice = process_wait_slice_ns(start, deadline_ns, kWaitSliceNs);
    if (slice == 0) return false;
    cv_.wait_for(lock, std::chrono::nanoseconds(slice));
  }
  // From here the event thread drops (acks) what arrives for the id: rdma_destroy_id waits.
  std::vector<std::shared_ptr<VerbsCmId>> orphans;  // new ids of unread CONNECT_REQUESTs
  if (auto it = by_id_.find(id); it != by_id_.end()) {
    by_raw_.erase(it->second->raw());
    by_id_.erase(it);
  }
  // Unread events of the id go unreported, as ucma_cleanup_ctx_events drops them.
  for (auto it = unread_.begin(); it != unread_.end();) {
    if (it->owner != id && it->ev.id != id) {
      ++it;
      continue;
    }
    if (it->ev.event == CmEventType::CONNECT_REQUEST && it->ev.id != id) {
      if (auto o = by_id_.find(it->ev.id); o != by_id_.end()) {
        orphans.push_back(o->second);
        by_raw_.erase(o->second->raw());
        by_id_.erase(o);
      }
    }
    rdma_ack_cm_event(it->raw);
    it = unread_.erase(it);
  }
  reported_.erase(id);
  completed_.erase(id);
  lock.unlock();
  for (auto& o : orphans) o->release();  // the listener's backlog goes with it
  return true;
}

void VerbsCmEventChannel::destroy() {
  ch_.get("rdma_destroy_event_channel");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!by_id_.empty()) {
      throw Error("rdma_destroy_event_channel", EBUSY,
                  label_ + ": " + std::to_string(by_id_.size()) + " ids remain");
    }
  }
  stop_thread();
  ch_.destroy();
  record(label_, "verb", {{"verb", "rdma_destroy_event_channel"}});
}

void VerbsCmEventChannel::stop_thread() {
  stop_ = true;
  wake_.wake();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void VerbsCmEventChannel::release() noexcept {
  stop_thread();
  std::map<uint64_t, std::shared_ptr<VerbsCmId>> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& h : unread_) rdma_ack_cm_event(h.raw);
    for (auto& [seq, h] : read_) rdma_ack_cm_event(h.raw);
    unread_.clear();
    read_.clear();
    ids.swap(by_id_);
    by_raw_.clear();
  }
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {  // NOLINT(modernize-loop-convert)
    it->second->release();                                // newest first
  }
  ch_.reset();
}

}  // namespace rdmalab::verbs
