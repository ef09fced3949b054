// The rdma_cm event channel (ucma's event file): events queue per channel, reading one counts
// it as reported on its id, rdma_ack_cm_event completes it; rdma_destroy_id waits for that.
#include <algorithm>
#include <sstream>

#include "model/cm_rdma.h"
#include "model/process.h"

namespace rdmalab::model {

ModelCmEventChannel::ModelCmEventChannel(ModelProcess& proc)
    : ModelObject(proc.host().device().env, proc.host().name(), "cm_channel"), proc_(proc) {}

Device& ModelCmEventChannel::dev() const {
  return proc_.host().device();
}

std::shared_ptr<CmId> ModelCmEventChannel::create_id() {
  enter("rdma_create_id");
  auto id = std::make_shared<ModelCmId>(*this);
  ids_[id->id()] = id;
  env().record_fields(st_.host, id->label(), "verb",
                      {{"verb", "rdma_create_id"}, {"channel", st_.label}, {"ps", "RDMA_PS_TCP"}});
  return id;
}

std::shared_ptr<ModelCmId> ModelCmEventChannel::adopt_passive() {
  auto id = std::make_shared<ModelCmId>(*this);
  ids_[id->id()] = id;
  return id;
}

std::shared_ptr<CmId> ModelCmEventChannel::find_id(uint64_t id_object) const {
  st_.check("rdma_cm_id");
  auto it = ids_.find(id_object);
  if (it == ids_.end())
    throw Error("rdma_cm_id", ENOENT, "no cm_id:" + std::to_string(id_object) + " on " + st_.label);
  return it->second;
}

void ModelCmEventChannel::queue(const CmEvent& ev_in, uint64_t owner) {
  if (!st_.live()) return;
  CmEvent ev = ev_in;
  ev.seq = next_seq_++;
  queue_.push_back({ev, owner});
}

std::optional<CmEvent> ModelCmEventChannel::get_event(TimeNs deadline_ns) {
  enter("rdma_get_cm_event");
  auto self = shared_from_this();  // the process may be killed while we wait
  env().runtime.wait_until([this] { return !queue_.empty() || !st_.live(); }, deadline_ns);
  if (!st_.live() || queue_.empty()) return std::nullopt;
  Queued q = queue_.front();
  queue_.pop_front();
  ++counts_[q.owner].reported;  // ucma_get_event: events_reported++ on the owning context
  read_unacked_[q.ev.seq] = q.owner;
  env().record_fields(st_.host, "cm_id:" + std::to_string(q.ev.id), "cm_event_read",
                      {{"event", to_string(q.ev.event)},
                       {"status", q.ev.status},
                       {"seq", q.ev.seq},
                       {"listen_id", q.ev.listen_id}});
  return q.ev;
}

void ModelCmEventChannel::ack_event(const CmEvent& ev) {
  enter("rdma_ack_cm_event");
  auto it = read_unacked_.find(ev.seq);
  const bool known = it != read_unacked_.end();
  if (known) {
    ++counts_[it->second].completed;
    read_unacked_.erase(it);
  }
  env().record_fields(st_.host, "cm_id:" + std::to_string(ev.id), "cm_event_ack",
                      {{"event", to_string(ev.event)}, {"seq", ev.seq}, {"known", known}});
}

uint64_t ModelCmEventChannel::unacked(uint64_t owner) const {
  auto it = counts_.find(owner);
  return it == counts_.end() ? 0 : it->second.reported - it->second.completed;
}

size_t ModelCmEventChannel::unread_connect_requests(uint64_t listen_id) const {
  return static_cast<size_t>(std::count_if(queue_.begin(), queue_.end(), [&](const Queued& q) {
    return q.ev.event == CmEventType::CONNECT_REQUEST && q.ev.listen_id == listen_id;
  }));
}

void ModelCmEventChannel::forget(uint64_t id) {
  std::vector<uint64_t> orphans;  // new ids of a listener's unread CONNECT_REQUESTs
  for (auto it = queue_.begin(); it != queue_.end();) {
    const bool mine = it->ev.id == id || (it->owner == id && it->ev.listen_id == id);
    if (!mine) {
      ++it;
      continue;
    }
    if (it->ev.event == CmEventType::CONNECT_REQUEST && it->ev.id != id)
      orphans.push_back(it->ev.id);
    env().record_fields(st_.host, "cm_id:" + std::to_string(it->ev.id), "cm_event_dropped",
                        {{"event", std::string(to_string(it->ev.event))}, {"seq", it->ev.seq}});
    it = queue_.erase(it);
  }
  counts_.erase(id);
  for (auto it = read_unacked_.begin(); it != read_unacked_.end();) {
    it = it->second == id ? read_unacked_.erase(it) : std::next(it);
  }
  ids_.erase(id);
  for (uint64_t o : orphans) {
    auto it = ids_.find(o);
    if (it != ids_.end()) it->second->release(Release::kVerb);
  }
}

void ModelCmEventChannel::destroy() {
  enter("rdma_destroy_event_channel");
  if (!ids_.empty()) {
    throw Error("rdma_destroy_event_channel", EBUSY,
                st_.label + ": " + std::to_string(ids_.size()) + " ids remain");
  }
  release(Release::kVerb);
}

void ModelCmEventChannel::release(Release why) {
  if (!st_.live()) return;
  auto self = shared_from_this();
  std::vector<std::shared_ptr<ModelCmId>> ids;
  for (const auto& [n, id] : ids_) ids.push_back(id);
  for (size_t i = ids.size(); i-- > 0;) ids[i]->release(why);  // newest first
  ids_.clear();
  queue_.clear();
  counts_.clear();
  read_unacked_.clear();
  st_.end(why, "rdma_destroy_event_channel");
}

std::string ModelCmEventChannel::dump() const {
  std::ostringstream out;
  out << "    " << st_.label << (st_.live() ? "" : " (ended)") << " events queued " << queue_.size()
      << " unacked " << read_unacked_.size() << "\n";
  for (const auto& [n, id] : ids_) out << id->dump();
  return out.str();
}

}  // namespace rdmalab::model
