#include "verbs/events.h"

#include <fcntl.h>
#include <atomic>
#include <ctime>

#include <algorithm>
#include <chrono>
#include <utility>

#include "rdmalab/error.h"
#include "verbs/convert.h"
#include "verbs/stall_meter.h"

namespace rdmalab::verbs {

namespace {
// A read waits on the condition variable that deliver and interrupt notify: the slice only
// bounds a wait that nobody notified (each wake-up costs a TCG guest ~0.4 ms of its vCPU).
constexpr TimeNs kWaitSliceNs = kNsPerSec;

// The history name of the event's object: the label the object itself records under.
std::string object_label(const AsyncEvent& ev) {
  switch (ev.kind) {
    case ObjectKind::QP:
      return "qp:" + std::to_string(ev.object_id);
    case ObjectKind::CQ:
      return "cq:" + std::to_string(ev.object_id);
    case ObjectKind::SRQ:
      return "srq:" + std::to_string(ev.object_id);
    case ObjectKind::PORT:
      return "port:" + std::to_string(ev.port_num);
    default:
      return "device";
  }
}
}  // namespace

namespace {
std::atomic<TimeNs> g_clock_offset_ns{0};
}  // namespace

TimeNs monotonic_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<TimeNs>(ts.tv_sec) * kNsPerSec + ts.tv_nsec + g_clock_offset_ns.load();
}

void set_process_clock_offset(TimeNs offset_ns) {
  g_clock_offset_ns.store(offset_ns);
}

EventQueue::EventQueue(History* history, std::string host)
    : history_(history), host_(std::move(host)) {}

EventQueue::~EventQueue() {
  stop();
}

void EventQueue::start(ibv_context* ctx) {
  ctx_ = ctx;
  const int flags = fcntl(ctx->async_fd, F_GETFL);
  if (flags < 0 || fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw Error("fcntl", errno, "async_fd O_NONBLOCK");
  }
  thread_ = std::thread([this] { loop(); });
}

void EventQueue::stop() {
  stop_ = true;
  wake_.wake();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& h : unread_) ack_raw(h.raw);
  for (auto& [seq, h] : read_) ack_raw(h.raw);
  unread_.clear();
  read_.clear();
  cv_.notify_all();
}

void EventQueue::loop() {
  while (!stop_) {
    const WakeFd::Ready r = wake_.wait_readable(ctx_->async_fd);
    if (r == WakeFd::Ready::kGone) return;  // no more events
    if (r == WakeFd::Ready::kNothing) continue;
    ibv_async_event raw{};
    while (!stop_ && ibv_get_async_event(ctx_, &raw) == 0) deliver(raw);
  }
}

void EventQueue::ack_raw(ibv_async_event& raw) {
  if (ctx_ != nullptr) ibv_ack_async_event(&raw);
}

const void* EventQueue::element_of(const ibv_async_event& raw, ObjectKind kind) const {
  switch (kind) {
    case ObjectKind::QP:
      return raw.element.qp;
    case ObjectKind::CQ:
      return raw.element.cq;
    case ObjectKind::SRQ:
      return raw.element.srq;
    default:
      return nullptr;
  }
}

void EventQueue::deliver(const ibv_async_event& raw_in) {
  ibv_async_event raw = raw_in;
  const std::optional<AsyncEventType> type = from_ibv(raw.event_type);
  std::unique_lock<std::mutex> lock(mu_);
  Held h;
  h.raw = raw;
  if (!type) {
    ack_raw(raw);  // an event the engine does not model (WQ_FATAL): acked and dropped
    return;
  }
  h.ev.type = *type;
  h.ev.kind = affiliation(*type);
  if (h.ev.kind == ObjectKind::PORT) h.ev.port_num = static_cast<uint8_t>(raw.element.port_num);
  if (const void* el = element_of(raw, h.ev.kind); el != nullptr) {
    auto it = objects_.find(el);
    if (it == objects_.end() || it->second.destroying) {
      ack_raw(raw);  // for an object being destroyed: ibv_destroy_* waits for this ack
      return;
    }
    h.ev.object_id = it->second.id;
    if (h.ev.kind == ObjectKind::QP) h.ev.qp_num = it->second.num;
    if (h.ev.kind == ObjectKind::SRQ) h.ev.srq_num = it->second.num;
  }
  h.ev.seq = next_seq_++;
  unread_.push_back(h);
  lock.unlock();
  cv_.notify_all();
}

void EventQueue::add_object(const void* raw, ObjectKind kind, uint64_t id, uint32_t num) {
  std::lock_guard<std::mutex> lock(mu_);
  objects_[raw] = Entry{kind, id, num, false};
}

void EventQueue::ack_object_locked(uint64_t id, bool read_too) {
  for (auto it = unread_.begin(); it != unread_.end();) {
    if (it->ev.object_id == id && it->ev.kind != ObjectKind::PORT) {
      ack_raw(it->raw);
      it = unread_.erase(it);
    } else {
      ++it;
    }
  }
  if (!read_too) return;
  for (auto it = read_.begin(); it != read_.end();) {
    if (it->second.ev.object_id == id && it->second.ev.kind != ObjectKind::PORT) {
      ack_raw(it->second.raw);
      ++completed_[id];
      it = read_.erase(it);
    } else {
      ++it;
    }
  }
}

bool EventQueue::begin_destroy(const void* raw, uint64_t id, TimeNs deadline_ns) {
  std::unique_lock<std::mutex> lock(mu_);
  const TimeNs start = monotonic_now_ns();
  for (;;) {
    if (reported_[id] == completed_[id]) break;
    const TimeNs slice = process_wait_slice_ns(start, deadline_ns, kWaitSliceNs);
    if (slice == 0) return false;
    cv_.wait_for(lock, std::chrono::nanoseconds(slice));
  }
  if (auto it = objects_.find(raw); it != objects_.end()) it->second.destroying = true;
  ack_object_locked(id, false);
  return true;
}

void EventQueue::force_destroy(const void* raw, uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = objects_.find(raw); it != objects_.end()) it->second.destroying = true;
  ack_object_locked(id, true);
}

void EventQueue::abort_destroy(const void* raw) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = objects_.find(raw); it != objects_.end()) it->second.destroying = false;
}

void EventQueue::remove_object(const void* raw, uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  objects_.erase(raw);
  reported_.erase(id);
  completed_.erase(id);
}

uint64_t EventQueue::unacked(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto r = reported_.find(id);
  auto c = completed_.find(id);
  return (r == reported_.end() ? 0 : r->second) - (c == completed_.end() ? 0 : c->second);
}

void EventQueue::interrupt() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    interrupted_ = true;
  }
  cv_.notify_all();
}

std::optional<AsyncEvent> EventQueue::get(TimeNs deadline_ns) {
  std::unique_lock<std::mutex> lock(mu_);
  const TimeNs start = monotonic_now_ns();
  while (unread_.empty()) {
    if (std::exchange(interrupted_, false)) return std::nullopt;
    const TimeNs slice = process_wait_slice_ns(start, deadline_ns, kWaitSliceNs);
    if (slice == 0) return std::nullopt;
    cv_.wait_for(lock, std::chrono::nanoseconds(slice));
  }
  Held h = unread_.front();
  unread_.pop_front();
  if (h.ev.object_id != 0) ++reported_[h.ev.object_id];
  read_[h.ev.seq] = h;
  lock.unlock();
  if (history_ != nullptr) {
    history_->record(host_, object_label(h.ev), "async_event",
                     {{"event", std::string(to_string(h.ev.type))},
                      {"object_id", h.ev.object_id},
                      {"qp_num", h.ev.qp_num},
                      {"seq", h.ev.seq}});
  }
  return h.ev;
}

void EventQueue::ack(const AsyncEvent& ev) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = read_.find(ev.seq);
    if (it == read_.end()) {
      throw Error("ibv_ack_async_event", EINVAL,
                  "event seq " + std::to_string(ev.seq) + " was not read or is already acked");
    }
    ack_raw(it->second.raw);
    if (it->second.ev.object_id != 0) ++completed_[it->second.ev.object_id];
    read_.erase(it);
  }
  cv_.notify_all();
}

}  // namespace rdmalab::verbs
