// The VM lab's fabric switch (docs/vmlab.md, "The data fabric"): a learning Ethernet switch on a
// unix datagram socket, one datagram per frame, with the fault rules of rules.h applied to every
// frame and a control socket to change them at run time. Single-threaded: one poll loop over
// the data socket, the control listener and its clients, and a timer queue for delayed and
// held frames.
//
// Control protocol (unix stream socket, one JSON object per line each way; every reply has
// "ok" and, when false, "error"):
//   ping                           -> {}
//   add_rule    rule: {...}        -> id
//   remove_rule id: N              -> {}
//   clear                          -> removed: N
//   rules                          -> rules: [{id, rule, matched, acted}]
//   counters                       -> counters: {frames, actions, rules, forward}
//   history     since: SEQ, limit  -> records: [...], last_seq, evicted
//   hosts       hosts: {"a": {"mac": "52:54:00:..", "ip": "10.0.0.1"}}  -> hosts (no key: query)
//   pcap        path: FILE | null, max_bytes: N (0: no cap)  -> path, closed: {path, frames,
//               skipped} of the capture it ended (null if none); skipped: frames past max_bytes
// e.g. {"op":"add_rule","rule":{"action":"drop","cm":"DREP"}} -> {"ok":true,"id":1}. A line that
// is not a valid request gets an error reply and the connection stays usable; a line longer
// than max_line gets an error reply and the connection is closed.
//
// History records have seq, t_ns (CLOCK_MONOTONIC), rule and action. A rule's action is recorded
// when it takes a frame ("drop", "delay", ... with the frame's summary). A delayed or held frame
// gets a second record when it leaves the switch: action "release", of_seq (the seq of the
// "delay" or "reorder" record that kept it), reason ("delay_elapsed"; "next_frame": a later
// frame of its flow passed; "hold_deadline"; "dropped_at_shutdown": still kept when the switch
// stopped, never sent) and held_ns (t_ns of the release minus t_ns of that record). Releases are
// recorded in the order the frames are sent. Counters: forward.released counts the frames sent
// after a delay or hold, forward.released_by splits them by reason, and
// forward.dropped_at_shutdown counts the rest.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "faults/fd.h"
#include "faults/frame.h"
#include "faults/pcap.h"
#include "faults/ruleset.h"

namespace rdmalab::faults {

struct SwitchOptions {
  std::string sock;                // the socket the VMs send to (qemu's remote.path)
  std::vector<std::string> peers;  // VM sockets known before they send (so ARP reaches them)
  std::string pcap;                // write every frame received here ("" = none)
  std::string control;             // the controller's stream socket ("" = none)
  uint64_t seed = 1;
  int stop_fd = -1;  // readable = stop (main passes a signalfd for SIGTERM and SIGINT)
  pid_t parent = 0;  // stop once getppid() is no longer this (0 = never)
  size_t max_line = 1 << 20;
};

class Switch {
 public:
  explicit Switch(SwitchOptions o);  // binds the sockets; throws std::system_error
  ~Switch();                         // unlinks the socket paths it bound
  Switch(const Switch&) = delete;
  Switch& operator=(const Switch&) = delete;

  void run();  // until stop_fd is readable, the parent is gone, or stop(); then shutdown()
  // One round of the loop: waits at most max_wait_ns (less when a timer is due).
  void poll_once(uint64_t max_wait_ns);
  void stop() { stopped_ = true; }
  // Drops the frames still delayed or held, recording a release for each (reason
  // "dropped_at_shutdown"); the switch keeps working after it.
  void shutdown();
  bool stopped() const { return stopped_; }

  nlohmann::json handle(const nlohmann::json& request);  // one control request, its reply
  RuleSet& rules() { return rules_; }

 private:
  struct Client {
    Fd fd;
    std::string in, out;
    bool read_closed = false;
    bool close_after_flush = false;
  };
  struct Pending {
    std::vector<uint8_t> frame;
    std::string sender;
    std::string flow;
    uint64_t recv_seq = 0;
    bool held = false;  // reorder: released by the next frame of its flow, or at the deadline
    uint64_t rule = 0, of_seq = 0;  // the decision's rule and history record
    uint64_t since_ns = 0;          // when it was received (t_ns of that record)
    std::multimap<uint64_t, uint64_t>::iterator timer;
  };
  // Why a delayed or held frame left: the "reason" of its release record.
  enum class Release : uint8_t { kDelayElapsed, kNextFrame, kHoldDeadline, kShutdown };

  // data path (switch.cc)
  void pump_data();
  void on_frame(std::vector<uint8_t> frame, std::string sender);
  void learn(const std::vector<uint8_t>& frame, const std::string& sender);
  std::vector<std::string> destinations(const std::vector<uint8_t>& frame,
                                        const std::string& sender);
  void deliver(const std::vector<uint8_t>& frame, const std::string& sender);
  void forward(const std::vector<uint8_t>& frame, const std::string& sender,
               const std::string& flow, uint64_t recv_seq, uint64_t now_ns);
  void schedule(std::vector<uint8_t> frame, std::string sender, std::string flow, uint64_t recv_seq,
                uint64_t now_ns, const Decision& d);
  void release_held(const std::string& flow, uint64_t before_seq, uint64_t now_ns);
  void note_release(const Pending& p, Release why, uint64_t now_ns);  // records and counts
  void fire_timers(uint64_t now_ns);
  uint64_t next_timeout_ns(uint64_t max_wait_ns, uint64_t now_ns) const;

  // control (control.cc)
  void accept_clients();
  void read_client(Client& c);
  void write_client(Client& c);
  void handle_line(Client& c, const std::string& line);
  nlohmann::json counters_json() const;

  SwitchOptions o_;
  Fd data_, listen_;
  std::vector<std::string> bound_;  // paths to unlink on exit
  std::vector<std::unique_ptr<Client>> clients_;
  std::optional<PcapWriter> pcap_;
  RuleSet rules_;
  bool stopped_ = false;

  std::vector<std::string> peers_;            // in the order first seen
  std::map<Mac, std::string> table_;          // learned: source MAC -> sender socket
  std::multimap<uint64_t, uint64_t> timers_;  // due (CLOCK_MONOTONIC ns) -> pending id
  std::map<uint64_t, Pending> pending_;
  std::map<std::string, std::vector<uint64_t>> held_;  // flow -> held pending ids
  uint64_t next_pending_ = 1, recv_seq_ = 0;
  struct {
    uint64_t received = 0, no_sender = 0, sent = 0, flooded = 0, peer_down = 0, send_errors = 0,
             released = 0, pcap_errors = 0;
    uint64_t delay_elapsed = 0, next_frame = 0, hold_deadline = 0, dropped_at_shutdown = 0;
  } fwd_;
};

uint64_t monotonic_ns();

}  // namespace rdmalab::faults
