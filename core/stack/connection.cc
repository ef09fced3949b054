#include "stack/connection.h"

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "rdmalab/error.h"
#include "stack/serial_queue.h"

namespace rdmalab::stack {

namespace {

// How long one blocking read lasts before the flags are looked at again: only a safety net,
// as stop and pause interrupt the channel's read (every wake-up of an idle thread costs a TCG
// guest about 0.4 ms of its vCPU).
constexpr TimeNs kEventPollNs = 200 * kNsPerMs;

struct Queued {
  CmEvent ev;
  CmHandler handler;  // chosen when the event was read
};

// One id's work list (iwcm_id_private's work_list) and what the pump knows of it.
struct Entry : SerialLane<Queued> {
  uint64_t id = 0;
  std::string label;
  CmHandler handler;                // the id's own, or inherited from its listener
  std::vector<CmEventRecord> seen;  // every event read for the id
  size_t requests_taken = 0;        // listener: CONNECT_REQUESTs handed out
  uint64_t running_listen_id = 0;   // a CONNECT_REQUEST handler: its listener
  bool destroying = false;
  bool hold_acks = false;     // hold_acks(): read events are not acked
  std::vector<CmEvent> held;  // read, handled or dropped, not acked
};

// Built key by key: a braced list would build each pair as a two-element array first, and
// several records per event make this the pump's hottest allocation.
nlohmann::json event_json(const CmEvent& ev) {
  nlohmann::json j(nlohmann::json::value_t::object);
  j["event"] = std::string(to_string(ev.event));
  j["status"] = ev.status;
  j["id"] = ev.id;
  j["seq"] = ev.seq;
  if (ev.event == CmEventType::CONNECT_REQUEST) j["listen_id"] = ev.listen_id;
  return j;
}

}  // namespace

struct CmEventPump::State : SerialQueue<Entry>::Runner {
  State(Runtime& rt, std::shared_ptr<CmEventChannel> c, History* h, std::string host_name)
      : runtime(rt), channel(std::move(c)), history(h), host(std::move(host_name)) {}

  Runtime& runtime;
  std::shared_ptr<CmEventChannel> channel;
  History* history;
  std::string host;

  std::mutex mu;  // short sections only: never held across a wait, a handler, an ack or a record
  SerialQueue<Entry> queue{runtime, mu, *this};  // its stop flag and live threads too
  // Never erased: a destroyed id stays as a tombstone, so its late events are dropped.
  std::map<uint64_t, std::shared_ptr<Entry>> entries;
  CmHandler fallback;
  CmPumpStats stats;
  bool paused = false;   // pause_reading(): the event thread leaves the channel alone
  bool reading = false;  // the event thread is in rdma_get_cm_event (or routing what it read)
  // Handler workers start with the first handler (watch, set_default_handler): without one
  // every event is acked as it is read, and on the model each idle worker costs a spawn and
  // baton passes at start and at stop.
  int workers = 0;
  bool has_handler = false;  // a handler was set: events may be queued for the workers
  bool workers_up = false;   // spawned since the last start

  void record(const std::string& object, const std::string& kind, nlohmann::json data) {
    if (history != nullptr) history->record(host, object, kind, std::move(data));
  }

  // event_json(ev) with "handler": how, without building the JSON object (one per event).
  void record_routed(const std::string& object, const std::string& kind, const CmEvent& ev,
                     const std::string& how) {
    if (history == nullptr) return;
    const std::string_view event = to_string(ev.event);
    if (ev.event == CmEventType::CONNECT_REQUEST) {
      history->record_fields(host, object, kind,
                             {{"event", event},
                              {"status", ev.status},
                              {"id", ev.id},
                              {"seq", ev.seq},
                              {"listen_id", ev.listen_id},
                              {"handler", how}});
    } else {
      history->record_fields(host, object, kind,
                             {{"event", event},
                              {"status", ev.status},
                              {"id", ev.id},
                              {"seq", ev.seq},
                              {"handler", how}});
    }
  }

  // rdma_ack_cm_event, unless the id's acks are held (hold_acks).
  void ack(const CmEvent& ev) {
    bool held = false;
    {
      std::lock_guard lock(mu);
      auto it = entries.find(ev.id);
      if (it != entries.end() && it->second->hold_acks) {
        it->second->held.push_back(ev);
        held = true;
      }
    }
    if (held) {
      record("cm_id:" + std::to_string(ev.id), "cm_ack_held", event_json(ev));
      return;
    }
    ack_now(ev);
  }

  void ack_now(const CmEvent& ev) {
    try {
      channel->ack_event(ev);
    } catch (const Error& e) {  // channel or id gone: nothing is left to wait for the ack
      auto data = event_json(ev);
      data["errno"] = e.err();
      record("", "cm_ack_failed", std::move(data));
    }
  }

  // The history's name for an id ("cm_id:3"); asked of the channel, so never under mu.
  std::string label_of(uint64_t id) {
    try {
      if (auto p = channel->find_id(id)) return p->label();
    } catch (const Error&) {  // NOLINT(bugprone-empty-catch): fall back to the number
    }
    return "cm_id:" + std::to_string(id);
  }

  std::shared_ptr<Entry> entry_locked(uint64_t id, const std::string& label) {
    auto& e = entries[id];
    if (!e) {
      e = std::make_shared<Entry>();
      e->id = id;
      e->label = label;
    }
    return e;
  }

  size_t count_locked(uint64_t id, CmEventType type) const {
    auto it = entries.find(id);
    if (it == entries.end()) return 0;
    return static_cast<size_t>(
        std::count_if(it->second->seen.begin(), it->second->seen.end(),
                      [type](const auto& r) { return r.event.event == type; }));
  }

  // rdma_destroy_id on a new id whose CONNECT_REQUEST no handler will see (its listener is
  // being destroyed): the CM answers the REQ with a REJ (cm_destroy_id in REQ_RCVD).
  void dispose_orphan(uint64_t id, const std::string& label, TimeNs deadline_ns) {
    try {
      if (auto p = channel->find_id(id)) p->destroy(deadline_ns);
      record(label, "cm_destroy_end", {{"id", id}, {"reason", "orphaned CONNECT_REQUEST"}});
    } catch (const Error& e) {
      record(label, "cm_destroy_failed", {{"id", id}, {"verb", e.verb()}, {"errno", e.err()}});
    }
  }

  static void start_workers(const std::shared_ptr<State>& s);
  void route(const CmEvent& ev);
  void event_loop();
  // The queue's Runner: one event of an id, with the handler chosen when it was read.
  void taken_locked(Entry& e, const Queued& q) override;
  bool run(Entry& e, Queued& q) override;
  void done_locked(Entry& e, const Queued& q, bool failed) override;
};

void CmEventPump::State::route(const CmEvent& ev) {
  const bool request = ev.event == CmEventType::CONNECT_REQUEST;
  const std::string label = label_of(ev.id);
  const std::string listener_label = request ? label_of(ev.listen_id) : "";
  std::shared_ptr<Entry> e;
  std::string how;
  {
    std::lock_guard lock(mu);
    ++stats.read;
    const TimeNs now = runtime.now_ns();
    e = entry_locked(ev.id, label);
    e->seen.push_back({ev, now});
    std::shared_ptr<Entry> listener;
    if (request) {
      listener = entry_locked(ev.listen_id, listener_label);
      listener->seen.push_back({ev, now});
      if (!e->handler && !listener->destroying) e->handler = listener->handler;  // inherited
    }
    CmHandler handler = e->handler ? e->handler : fallback;
    if (listener && listener->destroying && !e->destroying) {
      e->destroying = true;
      how = "orphaned";
      ++stats.dropped;
    } else if (e->destroying) {
      how = "dropped";
      ++stats.dropped;
    } else if (!handler) {
      how = "none";
      ++stats.unhandled;
    } else {
      how = e->handler ? "id" : "default";
      e->fifo.push_back({ev, std::move(handler)});  // scheduled after the record below
    }
  }
  const bool drop = how == "dropped" || how == "orphaned";
  record_routed(label, drop ? "cm_event_dropped_after_destroy" : "cm_event_dispatched", ev, how);
  if (drop || how == "none") {
    ack(ev);
    if (how == "orphaned") dispose_orphan(ev.id, label, runtime.now_ns() + kNsPerSec);
  } else {
    std::lock_guard lock(mu);
    queue.schedule_locked(e);
  }
  runtime.notify_all();
}

void CmEventPump::State::event_loop() {
  const auto done_reading = [this] {
    {
      std::lock_guard lock(mu);
      reading = false;
    }
    runtime.notify_all();
  };
  // The model wakes a blocked read on stop or pause (real threads see them at the next poll).
  const std::function<bool()> stop_or_pause = [this] {
    std::lock_guard lock(mu);
    return queue.stop || paused;
  };
  const TimeNs poll_ns = runtime.poll_interval_ns(kEventPollNs);
  while (!runtime.stopping()) {
    bool is_paused = false;
    {
      std::lock_guard lock(mu);
      if (queue.stop) break;
      is_paused = paused;
      reading = !paused;
    }
    if (is_paused) {  // pause_reading: the channel's events stay unread
      runtime.wait_notified(
          [this] {
            std::lock_guard lock(mu);
            return queue.stop || !paused;
          },
          runtime.now_ns() + poll_ns);
      continue;
    }
    std::optional<CmEvent> ev;
    try {
      const Runtime::WakeOn wake(runtime, stop_or_pause);
      ev = channel->get_event(runtime.now_ns() + poll_ns);
    } catch (const Error& e) {  // the channel went away (destroyed, process killed, reboot)
      record("", "cm_pump_error", {{"verb", e.verb()}, {"errno", e.err()}});
      done_reading();
      break;
    }
    if (ev) route(*ev);
    done_reading();
  }
}

void CmEventPump::State::taken_locked(Entry& e, const Queued& q) {
  e.running_listen_id = q.ev.event == CmEventType::CONNECT_REQUEST ? q.ev.listen_id : 0;
  stats.max_concurrent_per_id = std::max(stats.max_concurrent_per_id, e.running);
}

bool CmEventPump::State::run(Entry& e, Queued& q) {
  record(e.label, "cm_handler_begin", event_json(q.ev));
  bool failed = false;
  try {
    q.handler(q.ev);
  } catch (const std::exception& ex) {
    failed = true;
    auto data = event_json(q.ev);
    data["handler"] = e.label;  // the id whose queue ran it (a listener's handler: the new id)
    data["error"] = ex.what();
    record(e.label, "cm_handler_error", std::move(data));
  }
  record(e.label, "cm_handler_end", event_json(q.ev));
  ack(q.ev);
  return failed;
}

void CmEventPump::State::done_locked(Entry& e, const Queued& /*q*/, bool failed) {
  e.running_listen_id = 0;
  ++stats.delivered;
  if (failed) ++stats.handler_errors;
}

CmEventPump::CmEventPump(Runtime& runtime, std::shared_ptr<CmEventChannel> channel,
                         History* history, std::string host, int workers)
    : runtime_(runtime),
      channel_(channel),
      workers_(workers),
      state_(std::make_shared<State>(runtime, std::move(channel), history, std::move(host))) {
  if (!channel_) throw Error("CmEventPump", EINVAL, "no event channel");
  if (workers_ < 1) throw Error("CmEventPump", EINVAL, "need at least one worker");
}

CmEventPump::~CmEventPump() {
  try {
    stop(runtime_.now_ns() + kNsPerSec);
  } catch (...) {  // NOLINT(bugprone-empty-catch)
    // Threads still running keep the shared state alive and exit on the stop flag.
  }
}

void CmEventPump::State::start_workers(const std::shared_ptr<State>& s) {
  int n = 0;
  {
    std::lock_guard lock(s->mu);
    if (s->workers_up || !s->has_handler || s->queue.stop || s->queue.live_threads == 0) return;
    s->workers_up = true;
    n = s->workers;
    s->queue.live_threads += n;
  }
  for (int i = 0; i < n; ++i) {
    try {
      s->runtime.spawn(s->host + ":cm_worker" + std::to_string(i), [s] {
        s->queue.worker_loop();
        s->queue.thread_ended();
      });
    } catch (...) {  // the runtime is shutting down: the workers not spawned never ran
      std::lock_guard lock(s->mu);
      s->queue.live_threads -= n - i;
      throw;
    }
  }
}

void CmEventPump::start() {
  State& st = *state_;
  {
    std::lock_guard lock(st.mu);
    if (st.queue.live_threads > 0) {
      throw Error("CmEventPump::start", EALREADY, "already started");
    }
    st.queue.stop = false;
    st.queue.live_threads = 1;
    st.workers = workers_;
    st.workers_up = false;
  }
  std::shared_ptr<State> shared = state_;
  try {
    runtime_.spawn(st.host + ":cm_events", [shared] {
      shared->event_loop();
      shared->queue.thread_ended();
    });
  } catch (...) {
    std::lock_guard lock(st.mu);
    st.queue.live_threads = 0;
    throw;
  }
  State::start_workers(state_);  // a handler set before start (or before a restart)
}

bool CmEventPump::running() const {
  std::lock_guard lock(state_->mu);
  return state_->queue.live_threads > 0 && !state_->queue.stop;
}

void CmEventPump::stop(TimeNs deadline_ns) {
  State& st = *state_;
  if (!st.queue.begin_stop()) return;
  channel_->interrupt_get_event();
  const bool ended = st.queue.join(deadline_ns);
  std::vector<CmEvent> left;
  {
    std::lock_guard lock(st.mu);
    for (auto& [id, e] : st.entries) {
      for (auto& q : e->fifo) left.push_back(q.ev);
      e->fifo.clear();
      e->in_ready = false;
    }
    st.queue.clear_ready_locked();
    st.stats.dropped += left.size();
  }
  for (const auto& ev : left) {
    auto data = event_json(ev);
    data["reason"] = "stop";
    st.record("", "cm_event_dropped", std::move(data));
    st.ack(ev);
  }
  if (!ended) throw DeadlineExceeded("CmEventPump::stop", "a CM event handler is still running");
}

void CmEventPump::pause_reading(TimeNs deadline_ns) {
  State& st = *state_;
  {
    std::lock_guard lock(st.mu);
    st.paused = true;
  }
  st.record("", "cm_pump_paused", {{"channel", channel_->label()}});
  channel_->interrupt_get_event();
  runtime_.notify_all();
  const bool out = runtime_.wait_notified(
      [&st] {
        std::lock_guard lock(st.mu);
        return !st.reading || st.queue.live_threads == 0;
      },
      deadline_ns);
  if (!out) {
    throw DeadlineExceeded("CmEventPump::pause_reading", "the event thread is still reading");
  }
}

void CmEventPump::resume_reading() {
  {
    std::lock_guard lock(state_->mu);
    state_->paused = false;
  }
  state_->record("", "cm_pump_resumed", {{"channel", channel_->label()}});
  runtime_.notify_all();
}

void CmEventPump::hold_acks(const CmId& id) {
  check_owner(*channel_, id, "CmEventPump::hold_acks", "cm_id");
  const std::string label = id.label();
  {
    std::lock_guard lock(state_->mu);
    state_->entry_locked(id.id(), label)->hold_acks = true;
  }
  state_->record(label, "cm_hold_acks", {{"id", id.id()}});
}

size_t CmEventPump::release_acks(uint64_t id_object) {
  std::vector<CmEvent> held;
  {
    std::lock_guard lock(state_->mu);
    auto it = state_->entries.find(id_object);
    if (it == state_->entries.end()) return 0;
    it->second->hold_acks = false;
    held.swap(it->second->held);
  }
  state_->record("cm_id:" + std::to_string(id_object), "cm_acks_released",
                 {{"id", id_object}, {"acked", held.size()}});
  for (const auto& ev : held) state_->ack_now(ev);
  runtime_.notify_all();
  return held.size();
}

size_t CmEventPump::held_acks(uint64_t id_object) const {
  std::lock_guard lock(state_->mu);
  auto it = state_->entries.find(id_object);
  return it == state_->entries.end() ? 0 : it->second->held.size();
}

void CmEventPump::watch(const CmId& id, CmHandler handler) {
  // Another channel's events never come here: its ids cannot be watched.
  check_owner(*channel_, id, "CmEventPump::watch", "cm_id");
  if (!handler) throw Error("CmEventPump::watch", EINVAL, "empty handler");
  if (id.destroyed()) throw Error("CmEventPump::watch", EBADF, id.label() + " destroyed");
  const std::string label = id.label();
  {
    std::lock_guard lock(state_->mu);
    auto e = state_->entry_locked(id.id(), label);
    if (e->destroying) throw Error("CmEventPump::watch", EBADF, label + " is being destroyed");
    if (e->handler) throw Error("CmEventPump::watch", EEXIST, label + " already watched");
    e->handler = std::move(handler);
    state_->has_handler = true;
  }
  State::start_workers(state_);
}

void CmEventPump::set_default_handler(CmHandler handler) {
  {
    std::lock_guard lock(state_->mu);
    if (handler) state_->has_handler = true;
    state_->fallback = std::move(handler);
  }
  State::start_workers(state_);
}

std::vector<CmEventRecord> CmEventPump::events(uint64_t id_object) const {
  std::lock_guard lock(state_->mu);
  auto it = state_->entries.find(id_object);
  return it == state_->entries.end() ? std::vector<CmEventRecord>{} : it->second->seen;
}

std::optional<CmEvent> CmEventPump::wait_event(uint64_t id_object, CmEventType type,
                                               TimeNs deadline_ns, size_t min_count) {
  if (min_count == 0) throw Error("CmEventPump::wait_event", EINVAL, "min_count must be >= 1");
  State& st = *state_;
  const bool ok = runtime_.wait_notified(
      [&st, id_object, type, min_count] {
        std::lock_guard lock(st.mu);
        return st.count_locked(id_object, type) >= min_count;
      },
      deadline_ns);
  if (!ok) return std::nullopt;
  std::lock_guard lock(st.mu);
  size_t n = 0;
  for (const auto& r : st.entries.at(id_object)->seen) {
    if (r.event.event == type && ++n == min_count) return r.event;
  }
  return std::nullopt;  // unreachable: seen only grows
}

std::optional<CmEventRecord> CmEventPump::wait_first(uint64_t id_object,
                                                     const std::vector<CmEventType>& types,
                                                     TimeNs deadline_ns, size_t from_index) {
  State& st = *state_;
  auto find = [&st, id_object, &types, from_index]() -> std::optional<CmEventRecord> {
    auto it = st.entries.find(id_object);
    if (it == st.entries.end()) return std::nullopt;
    const auto& seen = it->second->seen;
    for (size_t i = from_index; i < seen.size(); ++i) {
      if (std::find(types.begin(), types.end(), seen[i].event.event) != types.end()) return seen[i];
    }
    return std::nullopt;
  };
  const bool ok = runtime_.wait_notified(
      [&st, &find] {
        std::lock_guard lock(st.mu);
        return find().has_value();
      },
      deadline_ns);
  if (!ok) return std::nullopt;
  std::lock_guard lock(st.mu);
  return find();
}

std::optional<CmEvent> CmEventPump::next_connect_request(uint64_t listen_id, TimeNs deadline_ns) {
  State& st = *state_;
  for (;;) {
    const bool ok = runtime_.wait_notified(
        [&st, listen_id] {
          std::lock_guard lock(st.mu);
          auto it = st.entries.find(listen_id);
          return it != st.entries.end() &&
                 st.count_locked(listen_id, CmEventType::CONNECT_REQUEST) >
                     it->second->requests_taken;
        },
        deadline_ns);
    if (!ok) return std::nullopt;
    std::lock_guard lock(st.mu);
    auto& e = *st.entries.at(listen_id);
    size_t n = 0;
    for (const auto& r : e.seen) {
      if (r.event.event != CmEventType::CONNECT_REQUEST) continue;
      if (n++ == e.requests_taken) {
        ++e.requests_taken;
        return r.event;
      }
    }
    // another caller took it between the wait and the lock: wait again
  }
}

CmPumpStats CmEventPump::stats() const {
  std::lock_guard lock(state_->mu);
  return state_->stats;
}

void CmEventPump::destroy_id(CmId& id, TimeNs deadline_ns) {
  check_owner(*channel_, id, "CmEventPump::destroy_id", "cm_id");
  State& st = *state_;
  const uint64_t idn = id.id();
  const std::string label = id.label();
  std::shared_ptr<Entry> e;
  std::vector<std::pair<std::string, CmEvent>> dropped;  // (label, event)
  std::vector<std::pair<uint64_t, std::string>> orphans;
  {
    std::lock_guard lock(st.mu);
    const auto self = std::this_thread::get_id();
    for (const auto& [cid, c] : st.entries) {
      if (c->running > 0 && c->running_thread == self &&
          (cid == idn || c->running_listen_id == idn)) {
        throw Error("rdma_destroy_id", EDEADLK, label + ": destroy from its own event handler");
      }
    }
    e = st.entry_locked(idn, label);
    e->destroying = true;
    for (auto& q : e->fifo) dropped.emplace_back(label, q.ev);
    e->fifo.clear();
    // New ids whose CONNECT_REQUEST from this listener no handler has seen yet.
    for (auto& [cid, c] : st.entries) {
      if (c->destroying || c->running > 0 || c->fifo.empty()) continue;
      const CmEvent& front = c->fifo.front().ev;
      if (front.event != CmEventType::CONNECT_REQUEST || front.listen_id != idn) continue;
      c->destroying = true;
      for (auto& q : c->fifo) dropped.emplace_back(c->label, q.ev);
      c->fifo.clear();
      orphans.emplace_back(cid, c->label);
    }
    st.stats.dropped += dropped.size();
  }
  st.record(label, "cm_destroy_begin",
            {{"id", idn}, {"dropped", dropped.size()}, {"orphans", orphans.size()}});
  for (const auto& [l, ev] : dropped) {
    st.record(l, "cm_event_dropped_after_destroy", event_json(ev));
    st.ack(ev);
  }
  for (const auto& [cid, l] : orphans) st.dispose_orphan(cid, l, deadline_ns);
  runtime_.notify_all();
  const bool idle = runtime_.wait_notified(
      [&st, e, idn] {
        std::lock_guard lock(st.mu);
        if (e->running > 0) return false;
        return std::none_of(st.entries.begin(), st.entries.end(),
                            [idn](const auto& kv) { return kv.second->running_listen_id == idn; });
      },
      deadline_ns);
  if (!idle) {
    st.record(label, "cm_destroy_timeout", {{"id", idn}});
    throw DeadlineExceeded("rdma_destroy_id", label + ": a CM event handler is still running");
  }
  try {
    id.destroy(deadline_ns);
  } catch (const Error& err) {
    st.record(label, "cm_destroy_failed",
              {{"id", idn}, {"verb", err.verb()}, {"errno", err.err()}});
    throw;
  }
  st.record(label, "cm_destroy_end", {{"id", idn}});
}

}  // namespace rdmalab::stack
