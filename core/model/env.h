// What every part of the model shares: the virtual clock and scheduler, the history, the engine
// id counter, the fault counters and the verb hook. One Env per lab; the model is single-threaded
// (only the SimRuntime baton holder runs), so none of this is locked.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "model/sim_runtime.h"
#include "rdmalab/history.h"
#include "rdmalab/model.h"

namespace rdmalab::model {

class Device;

// Shared by every object the lab hands out: objects outlive the lab when a scenario keeps a
// shared_ptr, and then only this flag may be read (every verb throws EBADF "lab shut down").
struct LabToken {
  bool alive = true;
};

// Time the "hardware" takes before the driver sees an event it raised itself (COMM_EST, CQ_ERR,
// SQ_DRAINED, ...). Injected events give their own driver delay.
inline constexpr TimeNs kDriverDelayNs = 1 * kNsPerUs;

struct Env {
  explicit Env(uint64_t seed_in)
      : seed(seed_in), runtime(seed_in), history([this] { return runtime.now_ns(); }) {}

  uint64_t seed;
  SimRuntime runtime;
  History history;
  std::shared_ptr<LabToken> token = std::make_shared<LabToken>();
  std::map<std::string, uint64_t> fault_counts;
  uint64_t next_id = 1;  // engine ids: one counter per lab, never reused
  uint64_t next_pid = 1000;
  VerbHook verb_hook;
  bool in_verb_hook = false;
  std::map<std::string, Device*> devices;  // by host name, for the fabric and fault verbs

  uint64_t new_id() { return next_id++; }

  void record(const std::string& host, const std::string& object, const std::string& kind,
              nlohmann::json data = nlohmann::json::object()) {
    history.record(host, object, kind, std::move(data));
  }

  // record() for flat data (strings, integers, booleans) without building a JSON object.
  void record_fields(const std::string& host, const std::string& object, const std::string& kind,
                     std::initializer_list<HistoryField> data) {
    history.record_fields(host, object, kind, data);
  }

  // Every fault is counted and recorded as kind "fault" with data.fault = its name.
  void fault(const std::string& host, const std::string& object, const std::string& name,
             nlohmann::json data = nlohmann::json::object()) {
    ++fault_counts[name];
    data["fault"] = name;
    history.record(host, object, "fault", std::move(data));
  }

  // The timing-fault hook at the entry of a verb; not re-entered from inside the hook.
  void enter_verb(const std::string& host, const std::string& verb, const std::string& object,
                  uint32_t qp_num = 0) {
    if (!verb_hook || in_verb_hook) return;
    in_verb_hook = true;
    struct Reset {
      bool& flag;
      ~Reset() { flag = false; }
    } reset{in_verb_hook};
    verb_hook(VerbCall{host, verb, object, qp_num});
  }

  bool mutated(Mutation m) const { return runtime.mutated(m); }

  Device* device(const std::string& host) const {
    auto it = devices.find(host);
    return it == devices.end() ? nullptr : it->second;
  }
};

}  // namespace rdmalab::model
