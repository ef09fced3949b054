// Planted defects for the swarm's mutation test (FoundationDB's BUGGIFY, turned into known
// bugs): each is off unless a model lab is made with it on (LabOptions::mutations), and each
// lives at exactly one engine site marked `// MUTATION(<name>): <what it breaks>`. Model code
// asks Env::mutated, stack code Runtime::mutated; the verbs backend never mutates.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rdmalab {

enum class Mutation : uint8_t {
  kLostFlushCompletion,
  kHandlerAfterDestroy,
  kMissingDisconnected,
  kDoubleTimewaitExit,
  kDestroyIgnoresUnacked,
};

struct MutationInfo {
  Mutation id;
  std::string_view name;
  std::string_view breaks;
};

// The one table of names: validation, the Python list and the history all read it.
inline constexpr std::array<MutationInfo, 5> kMutations = {{
    {Mutation::kLostFlushCompletion, "lost_flush_completion",
     "a QP's first flush completion (WR_FLUSH_ERR) never reaches its CQ"},
    {Mutation::kHandlerAfterDestroy, "handler_after_destroy",
     "AsyncDispatcher: events queued for an object when it is destroyed run after destroy_end"},
    {Mutation::kMissingDisconnected, "missing_disconnected",
     "rdma_cm: the passive closer (an id whose user never called rdma_disconnect) gets no "
     "DISCONNECTED"},
    {Mutation::kDoubleTimewaitExit, "double_timewait_exit",
     "rdma_cm over the IB CM: TIMEWAIT_EXIT is delivered twice"},
    {Mutation::kDestroyIgnoresUnacked, "destroy_ignores_unacked",
     "rdma_destroy_id returns at once while an event of the id is read and not acked"},
}};

// mutation_name indexes the table by enum value.
constexpr bool mutation_table_in_enum_order() {
  for (size_t i = 0; i < kMutations.size(); ++i) {
    if (static_cast<size_t>(kMutations[i].id) != i) return false;
  }
  return true;
}
static_assert(mutation_table_in_enum_order());

inline std::optional<Mutation> mutation_by_name(std::string_view name) {
  for (const auto& m : kMutations) {
    if (m.name == name) return m.id;
  }
  return std::nullopt;
}

inline std::string_view mutation_name(Mutation m) {
  return kMutations[static_cast<size_t>(m)].name;
}

// "a, b, c": for the error that refuses an unknown name.
inline std::string mutation_names() {
  std::string out;
  for (const auto& m : kMutations) out += (out.empty() ? "" : ", ") + std::string(m.name);
  return out;
}

// Which mutations a lab has on: a bit per Mutation, so asking costs nothing when none is.
class MutationSet {
 public:
  bool on(Mutation m) const { return (bits_ & bit(m)) != 0; }
  void set(Mutation m) { bits_ |= bit(m); }
  bool empty() const { return bits_ == 0; }

 private:
  static uint32_t bit(Mutation m) { return uint32_t{1} << static_cast<unsigned>(m); }
  uint32_t bits_ = 0;
};

}  // namespace rdmalab
