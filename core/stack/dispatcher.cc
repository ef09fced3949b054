#include "stack/dispatcher.h"

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
// as stop interrupts the context's read (every wake-up of an idle thread costs a TCG guest
// about 0.4 ms of its vCPU).
constexpr TimeNs kEventPollNs = 200 * kNsPerMs;

// One watched object (or the default sink): the per-id work list of iw_cm, the refcount of
// mlx5_core_rsc_common. refs = the initial reference + one per event queued or running.
struct Entry : SerialLane<AsyncEvent> {
  uint64_t id = 0;
  std::string label;
  AsyncHandler handler;
  // A copy taken with the event being handled: set_default_handler may replace handler.
  AsyncHandler running_handler;
  int refs = 1;
  uint64_t running_object = 0;  // object_id of the event being handled
  bool initial_ref_dropped = false;
};

nlohmann::json event_json(const AsyncEvent& ev) {
  return {{"event", std::string(to_string(ev.type))},
          {"qp_num", ev.qp_num},
          {"srq_num", ev.srq_num},
          {"object_id", ev.object_id},
          {"seq", ev.seq}};
}

}  // namespace

struct AsyncDispatcher::State : SerialQueue<Entry>::Runner {
  State(Runtime& rt, std::shared_ptr<Context> c, History* h, std::string host_name)
      : runtime(rt), ctx(std::move(c)), history(h), host(std::move(host_name)) {
    fallback->id = 0;
    fallback->label = "default";
  }

  Runtime& runtime;
  std::shared_ptr<Context> ctx;
  History* history;
  std::string host;

  std::mutex mu;  // short sections only: never held across a wait, a handler, an ack or a record
  SerialQueue<Entry> queue{runtime, mu, *this};        // its stop flag and live threads too
  std::map<uint64_t, std::shared_ptr<Entry>> table;    // watched, live
  std::map<uint64_t, std::shared_ptr<Entry>> retired;  // destroying or destroyed (tombstones)
  std::shared_ptr<Entry> fallback = std::make_shared<Entry>();
  std::map<uint64_t, std::vector<AsyncEvent>> routed;  // by object_id
  std::map<std::pair<uint64_t, AsyncEventType>, size_t> read_counts;
  // Read and done with: its handler returned, or it was dropped (destroy, stop) or had none.
  std::map<std::pair<uint64_t, AsyncEventType>, size_t> settled_counts;
  DispatcherStats stats;

  void record(const std::string& object, const std::string& kind, nlohmann::json data) {
    if (history != nullptr) history->record(host, object, kind, std::move(data));
  }

  void ack(const AsyncEvent& ev) {
    try {
      ctx->ack_async_event(ev);
    } catch (const Error& e) {  // a closed context: nothing left to wait for the ack
      auto data = event_json(ev);
      data["errno"] = e.err();
      record("", "ack_failed", std::move(data));
    }
  }

  // Queues ev on e and takes a reference for it (mu held). Not yet visible to workers, so
  // that "event_dispatched" precedes "handler_begin" in the history on real threads too.
  void enqueue_locked(const std::shared_ptr<Entry>& e, const AsyncEvent& ev) {
    e->fifo.push_back(ev);
    ++e->refs;
    routed[ev.object_id].push_back(ev);
  }

  void route(const AsyncEvent& ev);
  void event_loop();
  // The queue's Runner: one event of a watched object (or of the default sink).
  void taken_locked(Entry& e, const AsyncEvent& ev) override;
  bool run(Entry& e, AsyncEvent& ev) override;
  void done_locked(Entry& e, const AsyncEvent& ev, bool failed) override;
};

void AsyncDispatcher::State::route(const AsyncEvent& ev) {
  std::string target;
  std::shared_ptr<Entry> queued;
  bool dropped = false;
  bool no_handler = false;
  {
    std::lock_guard lock(mu);
    ++stats.read;
    ++read_counts[{ev.object_id, ev.type}];
    const bool affiliated = ev.object_id != 0 && affiliation(ev.type) != ObjectKind::DEVICE &&
                            affiliation(ev.type) != ObjectKind::PORT;
    auto live = affiliated ? table.find(ev.object_id) : table.end();
    if (live != table.end()) {
      target = live->second->label;
      queued = live->second;
    } else if (affiliated && retired.count(ev.object_id) != 0) {
      target = retired[ev.object_id]->label;
      dropped = true;
      ++stats.dropped;
      ++settled_counts[{ev.object_id, ev.type}];
    } else {
      target = fallback->label;
      ++stats.unaffiliated;
      no_handler = !fallback->handler;
      if (!no_handler) queued = fallback;
      if (no_handler) ++settled_counts[{ev.object_id, ev.type}];
    }
    if (queued) enqueue_locked(queued, ev);
  }
  if (dropped) {
    record(target, "event_dropped_after_destroy", event_json(ev));
    ack(ev);
    runtime.notify_all();  // settled_counts moved (wait_event)
    return;
  }
  auto data = event_json(ev);
  data["handler"] = no_handler ? "none" : target;
  record(target, "event_dispatched", std::move(data));
  if (no_handler) ack(ev);
  if (queued) {
    std::lock_guard lock(mu);
    queue.schedule_locked(queued);
  }
  runtime.notify_all();
}

void AsyncDispatcher::State::event_loop() {
  // The model wakes a blocked read on stop (real threads see it at the next poll).
  const std::function<bool()> stopped = [this] {
    std::lock_guard lock(mu);
    return queue.stop;
  };
  const TimeNs poll_ns = runtime.poll_interval_ns(kEventPollNs);
  while (!runtime.stopping()) {
    {
      std::lock_guard lock(mu);
      if (queue.stop) break;
    }
    std::optional<AsyncEvent> ev;
    try {
      const Runtime::WakeOn wake(runtime, stopped);
      ev = ctx->get_async_event(runtime.now_ns() + poll_ns);
    } catch (const Error& e) {  // the context went away (device closed, process killed)
      record("", "dispatcher_error", {{"verb", e.verb()}, {"errno", e.err()}});
      break;
    }
    if (ev) route(*ev);
  }
}

void AsyncDispatcher::State::taken_locked(Entry& e, const AsyncEvent& ev) {
  e.running_handler = e.handler;
  e.running_object = ev.object_id;
  stats.max_concurrent_per_object = std::max(stats.max_concurrent_per_object, e.running);
}

bool AsyncDispatcher::State::run(Entry& e, AsyncEvent& ev) {
  AsyncHandler handler;  // released here, without mu
  handler.swap(e.running_handler);
  record(e.label, "handler_begin", event_json(ev));
  bool failed = false;
  try {
    if (handler) handler(ev);
  } catch (const std::exception& ex) {
    failed = true;
    auto data = event_json(ev);
    data["handler"] = e.label;  // the watched object's label, or "default"
    data["error"] = ex.what();
    record(e.label, "handler_error", std::move(data));
  }
  record(e.label, "handler_end", event_json(ev));
  ack(ev);
  return failed;
}

void AsyncDispatcher::State::done_locked(Entry& e, const AsyncEvent& ev, bool failed) {
  --e.refs;
  e.running_object = 0;
  ++stats.delivered;
  ++settled_counts[{ev.object_id, ev.type}];
  if (failed) ++stats.handler_errors;
}

AsyncDispatcher::AsyncDispatcher(Runtime& runtime, std::shared_ptr<Context> ctx, History* history,
                                 std::string host, int workers)
    : runtime_(runtime),
      ctx_(ctx),
      workers_(workers),
      state_(std::make_shared<State>(runtime, std::move(ctx), history, std::move(host))) {
  if (workers_ < 1) throw Error("AsyncDispatcher", EINVAL, "need at least one worker");
}

AsyncDispatcher::~AsyncDispatcher() {
  try {
    stop(runtime_.now_ns() + kNsPerSec);
  } catch (...) {  // NOLINT(bugprone-empty-catch)
    // Threads still running keep the shared state alive and exit on the stop flag.
  }
}

void AsyncDispatcher::start() {
  State& st = *state_;
  {
    std::lock_guard lock(st.mu);
    if (st.queue.live_threads > 0) {
      throw Error("AsyncDispatcher::start", EALREADY, "already started");
    }
    st.queue.stop = false;
    st.queue.live_threads = 1 + workers_;
  }
  std::shared_ptr<State> shared = state_;
  runtime_.spawn(st.host + ":async_events", [shared] {
    shared->event_loop();
    shared->queue.thread_ended();
  });
  for (int i = 0; i < workers_; ++i) {
    runtime_.spawn(st.host + ":event_worker" + std::to_string(i), [shared] {
      shared->queue.worker_loop();
      shared->queue.thread_ended();
    });
  }
}

bool AsyncDispatcher::running() const {
  std::lock_guard lock(state_->mu);
  return state_->queue.live_threads > 0 && !state_->queue.stop;
}

void AsyncDispatcher::stop(TimeNs deadline_ns) {
  State& st = *state_;
  if (!st.queue.begin_stop()) return;
  ctx_->interrupt_get_async_event();
  const bool ended = st.queue.join(deadline_ns);
  std::vector<AsyncEvent> left;
  {
    std::lock_guard lock(st.mu);
    std::vector<std::shared_ptr<Entry>> all{st.fallback};
    for (auto& [id, e] : st.table) all.push_back(e);
    for (auto& e : all) {
      e->refs -= static_cast<int>(e->fifo.size());
      left.insert(left.end(), e->fifo.begin(), e->fifo.end());
      e->fifo.clear();
      e->in_ready = false;
    }
    st.queue.clear_ready_locked();
    st.stats.dropped += left.size();
    for (const auto& ev : left) ++st.settled_counts[{ev.object_id, ev.type}];
  }
  for (const auto& ev : left) {
    auto data = event_json(ev);
    data["reason"] = "stop";
    st.record("", "event_dropped", std::move(data));
    st.ack(ev);
  }
  if (!ended) throw DeadlineExceeded("AsyncDispatcher::stop", "a handler is still running");
}

void AsyncDispatcher::watch(const Object& obj, AsyncHandler handler) {
  // Another context's events never come here: its objects cannot be watched.
  check_owner(*ctx_, obj, "AsyncDispatcher::watch", object_kind(obj));
  if (!handler) throw Error("AsyncDispatcher::watch", EINVAL, "empty handler");
  if (obj.destroyed()) throw Error("AsyncDispatcher::watch", EBADF, obj.label() + " destroyed");
  auto e = std::make_shared<Entry>();
  e->id = obj.id();
  e->label = obj.label();
  e->handler = std::move(handler);
  std::lock_guard lock(state_->mu);
  if (state_->table.count(e->id) != 0) {
    throw Error("AsyncDispatcher::watch", EEXIST, e->label + " already watched");
  }
  state_->retired.erase(e->id);  // ids are never reused; this only clears a stale tombstone
  state_->table.emplace(e->id, std::move(e));
}

void AsyncDispatcher::set_default_handler(AsyncHandler handler) {
  std::lock_guard lock(state_->mu);
  state_->fallback->handler = std::move(handler);
}

void AsyncDispatcher::destroy_qp(Qp& qp, TimeNs deadline_ns) {
  destroy_object(
      qp, [&qp, deadline_ns] { qp.destroy(deadline_ns); }, deadline_ns);
}

void AsyncDispatcher::destroy_srq(Srq& srq, TimeNs deadline_ns) {
  destroy_object(
      srq, [&srq, deadline_ns] { srq.destroy(deadline_ns); }, deadline_ns);
}

void AsyncDispatcher::destroy_cq(Cq& cq, TimeNs deadline_ns) {
  destroy_object(
      cq, [&cq, deadline_ns] { cq.destroy(deadline_ns); }, deadline_ns);
}

namespace {

// Moves the events of object_id out of fifo.
std::vector<AsyncEvent> take_events(std::deque<AsyncEvent>& fifo, uint64_t object_id) {
  std::vector<AsyncEvent> taken;
  std::deque<AsyncEvent> kept;
  for (auto& ev : fifo) {
    if (ev.object_id == object_id) {
      taken.push_back(ev);
    } else {
      kept.push_back(ev);
    }
  }
  fifo.swap(kept);
  return taken;
}

}  // namespace

void AsyncDispatcher::destroy_object(const Object& obj,
                                     const std::function<void()>& backend_destroy,
                                     TimeNs deadline_ns) {
  check_owner(*ctx_, obj, "destroy", object_kind(obj));  // only this context's objects
  State& st = *state_;
  const uint64_t id = obj.id();
  const std::string label = obj.label();
  std::shared_ptr<Entry> e;
  std::vector<AsyncEvent> dropped;
  {
    std::lock_guard lock(st.mu);
    auto live = st.table.find(id);
    auto old = st.retired.find(id);
    e = live != st.table.end() ? live->second : old != st.retired.end() ? old->second : nullptr;
    const auto self = std::this_thread::get_id();
    if ((e && e->running > 0 && e->running_thread == self) ||
        (st.fallback->running > 0 && st.fallback->running_object == id &&
         st.fallback->running_thread == self)) {
      throw Error("destroy", EDEADLK, label + ": destroy from its own event handler");
    }
    if (!e) {  // unwatched: a tombstone so that later events are dropped, not defaulted
      e = std::make_shared<Entry>();
      e->id = id;
      e->label = label;
    }
    if (live != st.table.end()) st.table.erase(live);
    st.retired[id] = e;
    dropped = take_events(e->fifo, id);
    e->refs -= static_cast<int>(dropped.size());
    if (!e->initial_ref_dropped) {
      e->initial_ref_dropped = true;
      --e->refs;
    }
    auto defaulted = take_events(st.fallback->fifo, id);
    st.fallback->refs -= static_cast<int>(defaulted.size());
    dropped.insert(dropped.end(), defaulted.begin(), defaulted.end());
    st.stats.dropped += dropped.size();
    for (const auto& ev : dropped) ++st.settled_counts[{ev.object_id, ev.type}];
  }
  st.record(label, "destroy_begin", {{"object_id", id}, {"dropped", dropped.size()}});
  for (const auto& ev : dropped) {
    st.record(label, "event_dropped_after_destroy", event_json(ev));
    st.ack(ev);
  }
  runtime_.notify_all();
  const bool idle = runtime_.wait_notified(
      [&st, e, id] {
        std::lock_guard lock(st.mu);
        const bool defaulting = st.fallback->running > 0 && st.fallback->running_object == id;
        return e->refs == 0 && !defaulting;
      },
      deadline_ns);
  if (!idle) {
    st.record(label, "destroy_timeout", {{"object_id", id}});
    throw DeadlineExceeded("destroy", label + ": an event handler is still running");
  }
  try {
    backend_destroy();
  } catch (const Error& err) {
    st.record(label, "destroy_failed", {{"verb", err.verb()}, {"errno", err.err()}});
    throw;
  }
  st.record(label, "destroy_end", {{"object_id", id}});
  // MUTATION(handler_after_destroy): the events destroy took off the object's queue go back on
  // it once the object is gone (already acked), so their handlers run after destroy_end.
  if (runtime_.mutated(Mutation::kHandlerAfterDestroy) && !dropped.empty()) {
    std::lock_guard lock(st.mu);
    e->fifo.insert(e->fifo.end(), dropped.begin(), dropped.end());
    e->refs += static_cast<int>(dropped.size());
    st.queue.schedule_locked(e);
  }
}

bool AsyncDispatcher::wait_event(uint64_t object_id, AsyncEventType type, TimeNs deadline_ns,
                                 size_t min_count) {
  return runtime_.wait_notified(
      [this, object_id, type, min_count] {
        std::lock_guard lock(state_->mu);
        auto it = state_->settled_counts.find({object_id, type});
        return it != state_->settled_counts.end() && it->second >= min_count;
      },
      deadline_ns);
}

size_t AsyncDispatcher::count_events(uint64_t object_id, AsyncEventType type) const {
  std::lock_guard lock(state_->mu);
  auto it = state_->read_counts.find({object_id, type});
  return it == state_->read_counts.end() ? 0 : it->second;
}

std::vector<AsyncEvent> AsyncDispatcher::events_for(uint64_t object_id) const {
  std::lock_guard lock(state_->mu);
  auto it = state_->routed.find(object_id);
  return it == state_->routed.end() ? std::vector<AsyncEvent>{} : it->second;
}

DispatcherStats AsyncDispatcher::stats() const {
  std::lock_guard lock(state_->mu);
  return state_->stats;
}

}  // namespace rdmalab::stack
