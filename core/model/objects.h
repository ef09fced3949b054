// The base of every object the model hands out: engine id, history label, liveness. An object
// ends by its verb (destroy, dealloc, ...), by its context closing, or by its owning process
// being killed; after that every verb on it throws EBADF, and once the lab is shut down too.
#pragma once

#include <cerrno>
#include <memory>
#include <string>

#include "model/env.h"
#include "rdmalab/error.h"
#include "rdmalab/verbs.h"

namespace rdmalab::model {

enum class Life { kLive, kDestroyed, kKilled };

// Why an object is being released. kClose: ibv_close_device or lab shutdown.
enum class Release { kVerb, kClose, kKill };

// Kill and close order (uverbs destroys by type): QPs first, contexts last.
enum class Rank { kQp = 0, kSrq = 1, kCq = 2, kMr = 3, kPd = 4, kXrcd = 5 };

// What a context keeps of each object it created, to release them in order.
class Owned {
 public:
  virtual ~Owned() = default;
  virtual Rank rank() const = 0;
  virtual uint64_t owned_id() const = 0;
  virtual bool owned_live() const = 0;
  // Ends the object now, without waiting for event acks; records the reason.
  virtual void release(Release why) = 0;
};

struct ObjectState {
  Env* env = nullptr;
  std::shared_ptr<LabToken> token;
  uint64_t id = 0;
  std::string label;
  std::string host;
  // Where it was made (verbs.h Owner): the context or channel it came through (itself for a
  // context or channel), kept by value so that it can be told after the lab is gone.
  const void* lab = nullptr;
  uint64_t owner_id = 0;
  std::string owner_label;
  Life life = Life::kLive;

  bool live() const { return token->alive && life == Life::kLive; }

  // EBADF unless live: the first thing every verb does, before it reads any other state.
  void check(const std::string& verb) const {
    if (!token->alive) throw Error(verb, EBADF, label + ": lab shut down");
    if (life == Life::kKilled) throw Error(verb, EBADF, label + ": owner process killed");
    if (life == Life::kDestroyed) throw Error(verb, EBADF, label + ": destroyed");
  }

  // Marks the object ended and records why.
  void end(Release why, const std::string& verb, nlohmann::json data = nlohmann::json::object()) {
    life = why == Release::kKill ? Life::kKilled : Life::kDestroyed;
    data["verb"] = verb;
    const char* kind = why == Release::kVerb   ? "verb"
                       : why == Release::kKill ? "destroyed_by_kill"
                                               : "destroyed_by_close";
    env->record(host, label, kind, std::move(data));
  }
};

template <class Base>
class ModelObject : public Base {
 public:
  uint64_t id() const override { return st_.id; }
  bool destroyed() const override { return !st_.live(); }
  std::string label() const override { return st_.label; }
  Owner owner() const override { return {st_.lab, st_.owner_id, st_.owner_label, st_.host}; }
  const ObjectState& state_of() const { return st_; }
  Env& env() const { return *st_.env; }

 protected:
  // A context or an event channel: its own owner.
  ModelObject(Env& env, std::string host, const std::string& prefix) {
    st_.env = &env;
    st_.token = env.token;
    st_.id = env.new_id();
    st_.label = prefix + ":" + std::to_string(st_.id);
    st_.host = std::move(host);
    st_.lab = &env.history;
    st_.owner_id = st_.id;
    st_.owner_label = st_.label;
  }
  // An object made through a context or channel (`through`'s state).
  ModelObject(const ObjectState& through, const std::string& prefix)
      : ModelObject(*through.env, through.host, prefix) {
    st_.owner_id = through.owner_id;
    st_.owner_label = through.owner_label;
  }

  // The verb prologue: liveness, the timing-fault hook, liveness again (the hook may kill).
  void enter(const std::string& verb, uint32_t qp_num = 0) {
    st_.check(verb);
    st_.env->enter_verb(st_.host, verb, st_.label, qp_num);
    st_.check(verb);
  }

  ObjectState st_;
};

}  // namespace rdmalab::model
