// rdmalab_bench_switch: frames per second through the fault switch (faults/, rdmalab-switch) and
// the latency it adds per frame, each beside a direct link measured in the same run
// (bench/switch.py turns the JSON this prints into figures).
//
// Three paths carry the same RoCEv2 frames (Ethernet, IPv4, UDP 4791, BTH, payload, ICRC: RC
// SEND_ONLY, built by faults/test_frames.h) between two bound unix datagram sockets, A and B, one
// datagram per Ethernet frame as qemu's -netdev dgram carries them (docs/vmlab.md, "The data
// fabric"):
//   direct            A -> B
//   switch_0_rules    A -> rdmalab-switch -> B
//   switch_N_rules    A -> rdmalab-switch holding N rules (--rules, 100) -> B; no rule matches
//                     the benchmark's frames, so each frame is checked against all N and
//                     forwarded (checked at the end: every rule's "matched" must be 0)
// The sender and receiver code is the same on every path; only the socket A sends to differs.
//
// Throughput: A sends for a fixed time, as fast as the next hop takes frames, while a thread on
// B counts what arrives. A's socket is connected to its next hop, so a full queue there makes A
// wait in poll() instead of losing the frame (qemu queues and retries too). The switch sends
// with MSG_DONTWAIT and drops a frame B's queue (net.unix.max_dgram_qlen) has no room for, as it
// does for a VM that falls behind: delivered frames/s and the loss are reported, with the
// switch's own count of those drops (forward.peer_down) beside them.
// Latency: ping-pong. A sends, a thread on B echoes a frame of the same size from B to A (the
// PSN tells which); one-way latency = round trip / 2, median and p99. A few round trips on every
// path before anything is measured let the switches learn both MACs (--peer names both sockets,
// so the very first frame is flooded to B): measured frames go to one port, not flooded.
// Rounds (--rounds) interleave the paths, so load from elsewhere on the machine falls on all of
// them alike. --cpu N puts this program's threads and the switches on one CPU: then the figures
// count the work per frame and per hop, not where the scheduler happens to wake a thread (in a
// VM, waking an idle vCPU costs tens of microseconds, at random).
//
// Every wait has a deadline: a switch that dies or stops forwarding ends the run with a message
// on stderr and exit status 1. The switches are children of this process and stop with it.
// Output: one JSON object on stdout.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "faults/fd.h"
#include "faults/test_frames.h"

extern char** environ;

namespace {

using nlohmann::json;
using rdmalab::faults::Fd;
namespace tf = rdmalab::faults::testing;

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kSec = 1'000 * kMs;
constexpr size_t kRing = 128;  // distinct frames per size and direction (PSN 0..127)
constexpr size_t kPsnOffset = 14 + 20 + 8 + 9;  // Ethernet, IPv4, UDP, then BTH byte 9
constexpr size_t kMaxFrame = 65536;
constexpr int kStallMs = 2'000;        // a next hop that takes no frame for this long is stuck
constexpr int kEchoTimeoutMs = 1'000;  // one ping-pong round trip
constexpr int kMaxTimeouts =
    3;  // round trips without an echo before the run fails (one never is lost)
constexpr uint64_t kQuietNs = 200 * kMs;  // after sending: B idle this long = nothing in flight

[[noreturn]] void fail(const std::string& msg) {
  throw std::runtime_error(msg);
}
[[noreturn]] void fail_errno(const std::string& what) {
  fail(what + ": " + std::strerror(errno));
}

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * kSec + static_cast<uint64_t>(ts.tv_nsec);
}

void sleep_ms(int ms) {
  timespec ts{ms / 1000, static_cast<long>(ms % 1000) * 1'000'000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// poll() on one fd, up to timeout_ms; EINTR counts as "not yet". Returns revents (0: timeout).
short poll_one(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  const int n = ::poll(&p, 1, timeout_ms);
  if (n < 0 && errno != EINTR) fail_errno("poll");
  return n > 0 ? p.revents : 0;
}

sockaddr_un unix_addr(const std::string& path, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof a.sun_path) fail("unix socket path too long: " + path);
  std::memcpy(a.sun_path, path.data(), path.size());
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return a;
}

Fd bound_dgram(const std::string& path) {
  Fd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) fail_errno("socket");
  socklen_t len = 0;
  const sockaddr_un a = unix_addr(path, len);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), len) != 0) fail_errno("bind " + path);
  return fd;
}

void connect_to(int fd, const std::string& path) {
  socklen_t len = 0;
  const sockaddr_un a = unix_addr(path, len);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0) fail_errno("connect " + path);
}

// The run's sockets live in a fresh directory under /tmp (sun_path holds 107 bytes).
class TempDir {
 public:
  TempDir() {
    std::string t = "/tmp/rdmalab-bench-switch-XXXXXX";
    if (::mkdtemp(t.data()) == nullptr) fail_errno("mkdtemp");
    path_ = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// An eventfd that tells a worker thread to stop.
class StopFlag {
 public:
  StopFlag() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (!fd_) fail_errno("eventfd");
  }
  void raise() const {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(fd_.get(), &one, sizeof one);
  }
  int fd() const { return fd_.get(); }

 private:
  Fd fd_;
};

// A thread that is always stopped and joined, and whose exception reaches the caller.
class Worker {
 public:
  template <class F>
  explicit Worker(F body)
      : t_([this, body = std::move(body)] {
          try {
            body(stop_.fd());
          } catch (...) {
            error_ = std::current_exception();
          }
        }) {}
  ~Worker() { join(); }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  void join() {
    if (!t_.joinable()) return;
    stop_.raise();
    t_.join();
  }
  void join_and_rethrow() {
    join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  StopFlag stop_;
  std::exception_ptr error_;
  std::thread t_;  // last: starts once the members it uses exist
};

// One rdmalab-switch child: its stdout goes to our stderr (stdout carries only the JSON).
class SwitchProcess {
 public:
  SwitchProcess(const std::string& exe, std::string name, std::string sock, std::string control,
                const std::vector<std::string>& peers)
      : name_(std::move(name)), sock_(std::move(sock)), control_(std::move(control)) {
    std::vector<std::string> args = {exe, "--sock", sock_, "--control", control_, "--seed", "1"};
    for (const std::string& p : peers) {
      args.push_back("--peer");
      args.push_back(p);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, 2, 1);
    const int rc = ::posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) fail("cannot start " + exe + ": " + std::strerror(rc));
  }
  ~SwitchProcess() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);  // a clean stop: it unlinks its sockets
    for (int i = 0; i < 300; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      sleep_ms(10);
    }
    std::fprintf(stderr, "rdmalab_bench_switch: %s did not stop on SIGTERM within 3 s: killed\n",
                 name_.c_str());
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  SwitchProcess(const SwitchProcess&) = delete;
  SwitchProcess& operator=(const SwitchProcess&) = delete;

  // Fails when the switch has exited, saying how.
  void check_alive() {
    int status = 0;
    if (pid_ <= 0 || ::waitpid(pid_, &status, WNOHANG) != pid_) return;
    pid_ = 0;
    if (WIFSIGNALED(status))
      fail(name_ + " (rdmalab-switch) was killed by signal " + std::to_string(WTERMSIG(status)));
    fail(name_ + " (rdmalab-switch) exited with status " + std::to_string(WEXITSTATUS(status)));
  }

  // The data socket is bound after the control socket: once it exists, both are up.
  void wait_ready(uint64_t timeout_ns) {
    const uint64_t deadline = now_ns() + timeout_ns;
    for (;;) {
      check_alive();
      struct stat st {};
      if (::stat(sock_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return;
      if (now_ns() > deadline)
        fail(name_ + " (rdmalab-switch) did not bind " + sock_ + " within " +
             std::to_string(timeout_ns / kMs) + " ms");
      sleep_ms(5);
    }
  }
  const std::string& name() const { return name_; }
  const std::string& sock() const { return sock_; }
  const std::string& control() const { return control_; }

 private:
  std::string name_, sock_, control_;
  pid_t pid_ = 0;
};

// The switch's control socket, as bindings/rdmalab/faults/fabric.py SwitchControl speaks it: one JSON
// object per line each way, every reply within a deadline.
class Control {
 public:
  explicit Control(SwitchProcess& sw) : sw_(sw), path_(sw.control()), name_(sw.name()) {
    fd_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd_) fail_errno("socket");
    socklen_t len = 0;
    const sockaddr_un a = unix_addr(path_, len);
    const uint64_t deadline = now_ns() + 5 * kSec;
    while (::connect(fd_.get(), reinterpret_cast<const sockaddr*>(&a), len) != 0) {
      if (errno != EAGAIN && errno != EINTR) broken("connect " + path_, errno);
      if (now_ns() > deadline) broken("connect " + path_ + ": no room for 5 s", 0);
      sleep_ms(5);
    }
  }

  json request(json req, int timeout_ms = 5'000) {
    const std::string op = req.value("op", "?");
    std::string line = req.dump() + "\n";
    const uint64_t deadline = now_ns() + static_cast<uint64_t>(timeout_ms) * kMs;
    const auto left_ms = [&]() -> int {
      const uint64_t now = now_ns();
      if (now >= deadline)
        broken("no reply to " + op + " within " + std::to_string(timeout_ms) + " ms", 0);
      return static_cast<int>((deadline - now + kMs - 1) / kMs);
    };
    size_t sent = 0;
    while (sent < line.size()) {
      const ssize_t n = ::send(fd_.get(), line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
      if (n >= 0) {
        sent += static_cast<size_t>(n);
      } else if (errno == EAGAIN || errno == EINTR) {
        poll_one(fd_.get(), POLLOUT, left_ms());
      } else {
        broken(op, errno);
      }
    }
    size_t nl;
    while ((nl = buf_.find('\n')) == std::string::npos) {
      char chunk[65536];
      const ssize_t n = ::recv(fd_.get(), chunk, sizeof chunk, 0);
      if (n > 0) {
        buf_.append(chunk, static_cast<size_t>(n));
      } else if (n == 0) {
        broken("closed during " + op, 0);
      } else if (errno == EAGAIN || errno == EINTR) {
        poll_one(fd_.get(), POLLIN, left_ms());
      } else {
        broken(op, errno);
      }
    }
    const json reply = json::parse(buf_.substr(0, nl), nullptr, false);
    buf_.erase(0, nl + 1);
    if (reply.is_discarded()) fail(name_ + " control: a reply to " + op + " that is not JSON");
    if (!reply.value("ok", false))
      fail(name_ + " refused " + op + ": " + reply.value("error", reply.dump()));
    return reply;
  }

 private:
  // The control socket failed: a switch that died says how (it may take a moment to be
  // reaped), else the socket's error.
  [[noreturn]] void broken(const std::string& what, int err) {
    for (int i = 0; i < 50; ++i) {
      sw_.check_alive();
      sleep_ms(10);
    }
    fail(name_ + " control " + path_ + ": " + what +
         (err ? std::string(": ") + std::strerror(err) : ""));
  }

  SwitchProcess& sw_;
  std::string path_, name_;
  Fd fd_;
  std::string buf_;
};

// The benchmark's frames for one payload size: RC SEND_ONLY A -> B (QPN 0x12) and B -> A (QPN
// 0x11), PSN i in slot i, ICRC valid.
struct Frames {
  size_t payload = 0;
  std::vector<tf::Frame8> ab, ba;
  size_t frame_bytes() const { return ab.front().size(); }
};

Frames build_frames(size_t payload) {
  Frames f;
  f.payload = payload;
  for (size_t i = 0; i < kRing; ++i) {
    tf::Roce r;
    r.opcode = 0x04;  // RC SEND_ONLY
    r.psn = static_cast<uint32_t>(i);
    for (size_t k = 0; k < payload; ++k) r.payload.push_back(static_cast<uint8_t>(i + k));
    r.pad = static_cast<uint8_t>((4 - payload % 4) % 4);
    r.dest_qpn = 0x12;
    f.ab.push_back(tf::roce_v4(r, tf::kMacB, tf::kMacA));
    r.dest_qpn = 0x11;
    f.ba.push_back(tf::roce_v4(r, tf::kMacA, tf::kMacB));
  }
  return f;
}

uint32_t psn_of(const uint8_t* frame, size_t n) {
  if (n < kPsnOffset + 3) return UINT32_MAX;
  return (uint32_t{frame[kPsnOffset]} << 16) | (uint32_t{frame[kPsnOffset + 1]} << 8) |
         frame[kPsnOffset + 2];
}

// A and B of one path. A is connected to its next hop (B, or the switch); B is bound only, as a
// VM's socket is, and answers through b_to.
struct Path {
  std::string name;
  int rules = 0;
  std::string a_path, b_path, b_to;
  Fd a, b;
  SwitchProcess* sw = nullptr;
  Control* ctl = nullptr;
};

void drain(int fd) {
  char buf[kMaxFrame];
  while (::recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
}

// Sends one frame on a connected socket, waiting (with a deadline) while the next hop is full.
void send_waiting(Path& p, const tf::Frame8& frame) {
  for (;;) {
    if (::send(p.a.get(), frame.data(), frame.size(), 0) >= 0) return;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      const int err = errno;
      if (p.sw) p.sw->check_alive();
      errno = err;
      fail_errno(p.name + ": send from A");
    }
    if (poll_one(p.a.get(), POLLOUT, kStallMs) == 0) {
      if (p.sw) p.sw->check_alive();
      fail(p.name + ": A's next hop took no frame for " + std::to_string(kStallMs) + " ms");
    }
  }
}

struct Throughput {
  uint64_t sent = 0, delivered = 0, wrong_size = 0;
  uint64_t switch_received = 0, switch_dropped = 0, switch_send_errors = 0, switch_flooded = 0;
  double send_s = 0, deliver_s = 0;  // first send to last send; first send to last arrival
};

struct SwitchCounts {
  uint64_t received = 0, peer_down = 0, send_errors = 0, flooded = 0;
};
SwitchCounts counts(Path& p) {
  if (!p.ctl) return {};
  const json c = p.ctl->request({{"op", "counters"}})["counters"];
  return {c["frames"]["received"].get<uint64_t>(), c["forward"]["peer_down"].get<uint64_t>(),
          c["forward"]["send_errors"].get<uint64_t>(), c["forward"]["flooded"].get<uint64_t>()};
}

Throughput measure_throughput(Path& p, const Frames& fr, uint64_t duration_ns) {
  drain(p.a.get());
  drain(p.b.get());
  const SwitchCounts before = counts(p);
  Throughput t;
  std::atomic<uint64_t> got{0}, wrong{0}, last_ns{0};
  const size_t want = fr.frame_bytes();
  Worker rx([&](int stop) {
    std::vector<uint8_t> buf(kMaxFrame);
    uint64_t n_got = 0, n_wrong = 0;
    for (;;) {
      pollfd fds[2] = {{p.b.get(), POLLIN, 0}, {stop, POLLIN, 0}};
      if (::poll(fds, 2, 100) < 0 && errno != EINTR) fail_errno("poll");
      for (;;) {
        const ssize_t n = ::recv(p.b.get(), buf.data(), buf.size(), MSG_DONTWAIT);
        if (n < 0) break;
        ++n_got;
        if (static_cast<size_t>(n) != want) ++n_wrong;
        last_ns.store(now_ns(), std::memory_order_relaxed);
        got.store(n_got, std::memory_order_release);
      }
      wrong.store(n_wrong, std::memory_order_relaxed);
      if (fds[1].revents != 0) return;
    }
  });
  const uint64_t t0 = now_ns();
  const uint64_t end = t0 + duration_ns;
  uint64_t i = 0;
  for (;; ++i) {
    if ((i & 31) == 0 && now_ns() >= end) break;
    send_waiting(p, fr.ab[i % kRing]);
  }
  const uint64_t t_sent = now_ns();
  t.sent = i;
  // What is still in flight arrives, or B stays quiet for kQuietNs: the rest was dropped.
  uint64_t seen = got.load(std::memory_order_acquire), since = now_ns();
  while (seen < t.sent) {
    sleep_ms(1);
    const uint64_t g = got.load(std::memory_order_acquire);
    if (g != seen) {
      seen = g;
      since = now_ns();
    } else if (now_ns() - since > kQuietNs) {
      break;
    }
  }
  rx.join_and_rethrow();
  t.delivered = got.load();
  t.wrong_size = wrong.load();
  t.send_s = static_cast<double>(t_sent - t0) / 1e9;
  const uint64_t last = std::max(last_ns.load(), t0 + 1);
  t.deliver_s = static_cast<double>(last - t0) / 1e9;
  if (p.sw) p.sw->check_alive();
  const SwitchCounts after = counts(p);
  t.switch_received = after.received - before.received;
  t.switch_dropped = after.peer_down - before.peer_down;
  t.switch_send_errors = after.send_errors - before.send_errors;
  t.switch_flooded = after.flooded - before.flooded;
  return t;
}

struct Latency {
  std::vector<uint64_t> rtt_ns;
  uint64_t timeouts = 0, stale = 0;
};

// The echo on B: every frame that arrives goes back, the same size, with the same PSN.
void echo(Path& p, const Frames& fr, int stop) {
  std::vector<uint8_t> buf(kMaxFrame);
  socklen_t len = 0;
  const sockaddr_un to = unix_addr(p.b_to, len);
  for (;;) {
    pollfd fds[2] = {{p.b.get(), POLLIN, 0}, {stop, POLLIN, 0}};
    if (::poll(fds, 2, 100) < 0 && errno != EINTR) fail_errno("poll");
    if (fds[1].revents != 0) return;
    for (;;) {
      const ssize_t n = ::recv(p.b.get(), buf.data(), buf.size(), MSG_DONTWAIT);
      if (n < 0) break;
      const uint32_t psn = psn_of(buf.data(), static_cast<size_t>(n));
      if (psn >= kRing) continue;
      const tf::Frame8& back = fr.ba[psn];
      const uint64_t deadline = now_ns() + static_cast<uint64_t>(kStallMs) * kMs;
      while (::sendto(p.b.get(), back.data(), back.size(), 0,
                      reinterpret_cast<const sockaddr*>(&to), len) < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
          fail_errno(p.name + ": echo from B to " + p.b_to);
        if (now_ns() > deadline)
          fail(p.name + ": B's echo found no room at " + p.b_to + " for " +
               std::to_string(kStallMs) + " ms");
        sleep_ms(1);  // unconnected: poll() cannot wait for room at the peer
      }
    }
  }
}

void ping_pong(Path& p, const Frames& fr, uint64_t warmup, uint64_t iterations, Latency& out) {
  drain(p.a.get());
  drain(p.b.get());
  Worker b([&](int stop) { echo(p, fr, stop); });
  std::vector<uint8_t> buf(kMaxFrame);
  for (uint64_t i = 0; i < warmup + iterations; ++i) {
    const uint32_t slot = static_cast<uint32_t>(i % kRing);
    const uint64_t t1 = now_ns();
    send_waiting(p, fr.ab[slot]);
    const uint64_t deadline = t1 + static_cast<uint64_t>(kEchoTimeoutMs) * kMs;
    bool answered = false;
    while (!answered) {
      const ssize_t n = ::recv(p.a.get(), buf.data(), buf.size(), MSG_DONTWAIT);
      if (n >= 0) {
        if (psn_of(buf.data(), static_cast<size_t>(n)) == slot) {
          answered = true;
          if (i >= warmup) out.rtt_ns.push_back(now_ns() - t1);
        } else {
          ++out.stale;  // a late echo of an earlier round trip
        }
        continue;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        fail_errno(p.name + ": recv on A");
      const uint64_t now = now_ns();
      if (now >= deadline) break;
      poll_one(p.a.get(), POLLIN, static_cast<int>((deadline - now + kMs - 1) / kMs));
    }
    if (answered) continue;
    if (p.sw) p.sw->check_alive();
    if (++out.timeouts > kMaxTimeouts)
      fail(p.name + ": " + std::to_string(out.timeouts) + " round trips without an echo within " +
           std::to_string(kEchoTimeoutMs) + " ms" +
           (p.sw ? " (the switch runs but forwards nothing)" : ""));
  }
  b.join_and_rethrow();
}

double percentile_us(std::vector<uint64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return static_cast<double>(v[i]) / 1e3;
}

struct Options {
  std::string switch_exe;
  bool quick = false;
  int rules = 100;
  std::vector<size_t> sizes = {64, 1024, 4096};
  uint64_t duration_ms = 0, iterations = 0, warmup = 0, rounds = 0, deadline_s = 0;
  std::optional<int> cpu;  // run everything (threads and switches) on this CPU
};

constexpr const char* kUsage =
    "usage: rdmalab_bench_switch --switch PATH [--quick] [--rules N] [--sizes 64,1024,4096]\n"
    "                            [--duration-ms N] [--iterations N] [--warmup N] [--rounds N]\n"
    "                            [--deadline-s N] [--cpu N]\n"
    "  --switch      the rdmalab-switch executable (build/faults/rdmalab-switch)\n"
    "  --quick       a smoke run: 1 round of 100 ms and 300 round trips per path and size\n"
    "  --rules       rules in the second switch, none matching the frames (100)\n"
    "  --sizes       RoCE payload bytes per frame (64,1024,4096)\n"
    "  --duration-ms sending time per round, path and size (400)\n"
    "  --iterations  ping-pong round trips per round, path and size (3000)\n"
    "  --rounds      rounds, each over every path and size in turn (3)\n"
    "  --deadline-s  the whole run must end within this (300)\n"
    "  --cpu         pin this program's threads and the switches to one CPU (default: the\n"
    "                scheduler places them)\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "%srdmalab_bench_switch: error: %s\n", kUsage, msg.c_str());
  std::exit(2);
}

uint64_t parse_uint(const std::string& s, const std::string& opt, uint64_t lo, uint64_t hi) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || s[0] == '-' || *end != '\0' || errno != 0 || v < lo || v > hi)
    usage_error(opt + ": expected an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                ", got '" + s + "'");
  return v;
}

Options parse_args(int argc, char** argv) {
  Options o;
  std::optional<uint64_t> duration, iterations, warmup, rounds;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(arg + ": expected one argument");
      return argv[++i];
    };
    if (arg == "--switch") {
      o.switch_exe = next();
    } else if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "--rules") {
      o.rules = static_cast<int>(parse_uint(next(), arg, 1, 100'000));
    } else if (arg == "--sizes") {
      o.sizes.clear();
      const std::string list = next();
      size_t start = 0;
      while (start <= list.size()) {
        const size_t comma = std::min(list.find(',', start), list.size());
        o.sizes.push_back(parse_uint(list.substr(start, comma - start), arg, 0, 4096));
        start = comma + 1;
      }
    } else if (arg == "--duration-ms") {
      duration = parse_uint(next(), arg, 1, 60'000);
    } else if (arg == "--iterations") {
      iterations = parse_uint(next(), arg, 1, 10'000'000);
    } else if (arg == "--warmup") {
      warmup = parse_uint(next(), arg, 0, 1'000'000);
    } else if (arg == "--rounds") {
      rounds = parse_uint(next(), arg, 1, 100);
    } else if (arg == "--deadline-s") {
      o.deadline_s = parse_uint(next(), arg, 1, 86'400);
    } else if (arg == "--cpu") {
      o.cpu = static_cast<int>(parse_uint(next(), arg, 0, CPU_SETSIZE - 1));
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      usage_error("unrecognized argument: " + arg);
    }
  }
  if (o.switch_exe.empty()) usage_error("the following argument is required: --switch");
  if (::access(o.switch_exe.c_str(), X_OK) != 0)
    usage_error("--switch " + o.switch_exe + ": not an executable (build target rdmalab-switch)");
  o.duration_ms = duration.value_or(o.quick ? 100 : 400);
  o.iterations = iterations.value_or(o.quick ? 300 : 3'000);
  o.warmup = warmup.value_or(o.quick ? 30 : 200);
  o.rounds = rounds.value_or(o.quick ? 1 : 3);
  if (o.deadline_s == 0) o.deadline_s = o.quick ? 60 : 300;
  return o;
}

// Rules a lab could hold, none of which matches an RC SEND_ONLY between a and b with QPN
// 0x11/0x12 and PSN < 128: each differs from the frames in one key, several only in their last
// key (after the hosts matched), so that every frame goes through all of them.
json rule(int i) {
  static const char* const kCm[] = {"REQ", "REP", "RTU", "DREQ", "DREP", "REJ", "MRA"};
  switch (i % 10) {
    case 0:
      return {{"action", "drop"}, {"direction", "a->b"}, {"dest_qpn", 0x1000 + i}};
    case 1:
      return {{"action", "drop"}, {"cm", kCm[(i / 10) % 7]}};
    case 2:
      return {{"action", "delay"},
              {"delay_ns", 1'000'000},
              {"direction", "a<->b"},
              {"proto", "roce"},
              {"opcode", "RDMA_WRITE_ONLY"}};
    case 3:
      return {{"action", "duplicate"}, {"proto", "roce"}, {"psn", 0x800000 + i}};
    case 4:
      return {{"action", "reorder"}, {"transport", "UD"}, {"hold_ns", 50'000'000}};
    case 5:
      return {{"action", "watch"}, {"proto", "tcp"}, {"tcp_flags", "SYN"}};
    case 6:
      return {{"action", "drop"}, {"direction", "c<->d"}, {"count", 1}};
    case 7:
      return {{"action", "drop"}, {"direction", "b->a"}, {"syndrome", "NAK_SEQ"}};
    case 8:
      return {{"action", "corrupt"},  {"layer", "bth"},         {"offset", 4},
              {"direction", "a<->b"}, {"dest_qpn", 0x2000 + i}, {"probability", 0.5}};
    default:
      return {{"action", "drop"}, {"src_host", "a"}, {"port", 4000 + i}};
  }
}

json hosts() {
  json h;
  for (int n = 1; n <= 4; ++n) {
    char mac[32];
    std::snprintf(mac, sizeof mac, "52:54:00:12:34:%02x", n);
    h[std::string(1, static_cast<char>('a' + n - 1))] = {{"mac", mac},
                                                         {"ip", "10.0.0." + std::to_string(n)}};
  }
  return h;
}

uint64_t read_sysctl(const char* path) {
  std::ifstream in(path);
  uint64_t v = 0;
  in >> v;
  return v;
}

int run(const Options& o) {
  const uint64_t start = now_ns();
  const uint64_t deadline = start + o.deadline_s * kSec;
  const auto check_deadline = [&](const std::string& what) {
    if (now_ns() > deadline)
      fail("the run passed its deadline of " + std::to_string(o.deadline_s) + " s at " + what);
  };

  if (o.cpu) {  // before any thread or switch exists: they inherit the mask
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(*o.cpu, &set);
    if (::sched_setaffinity(0, sizeof set, &set) != 0)
      fail_errno("--cpu " + std::to_string(*o.cpu) + ": sched_setaffinity");
  }
  TempDir dir;
  const std::string rules_name = "switch_" + std::to_string(o.rules) + "_rules";
  std::vector<Path> paths(3);
  paths[0].name = "direct";
  paths[1].name = "switch_0_rules";
  paths[2].name = rules_name;
  paths[2].rules = o.rules;
  for (size_t k = 0; k < paths.size(); ++k) {
    Path& p = paths[k];
    p.a_path = dir / ("p" + std::to_string(k) + "-a.sock");
    p.b_path = dir / ("p" + std::to_string(k) + "-b.sock");
    p.a = bound_dgram(p.a_path);
    p.b = bound_dgram(p.b_path);
  }
  // Each switch path has its own switch, so the rules of one never touch the other's frames.
  SwitchProcess sw0(o.switch_exe, "switch_0_rules", dir / "sw0.sock", dir / "sw0.ctl",
                    {paths[1].a_path, paths[1].b_path});
  SwitchProcess swn(o.switch_exe, rules_name, dir / "swn.sock", dir / "swn.ctl",
                    {paths[2].a_path, paths[2].b_path});
  sw0.wait_ready(10 * kSec);
  swn.wait_ready(10 * kSec);
  Control ctl0(sw0), ctln(swn);
  for (Control* c : {&ctl0, &ctln}) {
    c->request({{"op", "ping"}});
    c->request({{"op", "hosts"}, {"hosts", hosts()}});
  }
  for (int i = 0; i < o.rules; ++i) ctln.request({{"op", "add_rule"}, {"rule", rule(i)}});
  const size_t installed = ctln.request({{"op", "rules"}})["rules"].size();
  if (installed != static_cast<size_t>(o.rules))
    fail(rules_name + ": " + std::to_string(installed) + " rules installed, not " +
         std::to_string(o.rules));

  connect_to(paths[0].a.get(), paths[0].b_path);
  paths[0].b_to = paths[0].a_path;
  for (auto [p, sw, ctl] :
       {std::tuple{&paths[1], &sw0, &ctl0}, std::tuple{&paths[2], &swn, &ctln}}) {
    connect_to(p->a.get(), sw->sock());
    p->b_to = sw->sock();
    p->sw = sw;
    p->ctl = ctl;
  }

  std::vector<Frames> frames;
  for (size_t s : o.sizes) frames.push_back(build_frames(s));
  // A few round trips first on every path, so each switch has learned both MACs (as a lab's
  // switch has once ARP ran) and forwards to one port instead of flooding.
  for (Path& p : paths) {
    Latency ignored;
    ping_pong(p, frames.front(), 10, 0, ignored);
  }

  // [path][size]
  std::vector<std::vector<Throughput>> tp(paths.size(), std::vector<Throughput>(frames.size()));
  std::vector<std::vector<Latency>> lat(paths.size(), std::vector<Latency>(frames.size()));
  for (uint64_t round = 0; round < o.rounds; ++round) {
    for (size_t s = 0; s < frames.size(); ++s) {
      for (size_t k = 0; k < paths.size(); ++k) {
        const size_t pk = (k + round + s) % paths.size();  // each path goes first in turn
        Path& p = paths[pk];
        const std::string what = p.name + ", " + std::to_string(frames[s].payload) + " B";
        check_deadline(what);
        std::fprintf(stderr, "round %llu: %s\n", static_cast<unsigned long long>(round + 1),
                     what.c_str());
        const Throughput t = measure_throughput(p, frames[s], o.duration_ms * kMs);
        Throughput& acc = tp[pk][s];
        acc.sent += t.sent;
        acc.delivered += t.delivered;
        acc.wrong_size += t.wrong_size;
        acc.switch_received += t.switch_received;
        acc.switch_dropped += t.switch_dropped;
        acc.switch_send_errors += t.switch_send_errors;
        acc.switch_flooded += t.switch_flooded;
        acc.send_s += t.send_s;
        acc.deliver_s += t.deliver_s;
        check_deadline(what);
        ping_pong(p, frames[s], o.warmup, o.iterations, lat[pk][s]);
      }
    }
  }

  // None of the rules may have matched a frame: else the figure would not be what it says.
  uint64_t matched = 0;
  for (const json& r : ctln.request({{"op", "rules"}})["rules"])
    matched += r["matched"].get<uint64_t>();
  if (matched != 0)
    fail(rules_name + ": the rules matched " + std::to_string(matched) +
         " of the benchmark's frames; they must match none");

  json out;
  out["sizes"] = json::array();
  for (const Frames& f : frames)
    out["sizes"].push_back({{"payload", f.payload}, {"frame_bytes", f.frame_bytes()}});
  out["rules"] = o.rules;
  out["rules_matched"] = matched;
  out["rule_examples"] = json::array();
  for (int i = 0; i < std::min(o.rules, 10); ++i) out["rule_examples"].push_back(rule(i));
  out["rounds"] = o.rounds;
  out["duration_ms_per_round"] = o.duration_ms;
  out["iterations_per_round"] = o.iterations;
  out["warmup"] = o.warmup;
  out["quick"] = o.quick;
  out["max_dgram_qlen"] = read_sysctl("/proc/sys/net/unix/max_dgram_qlen");
  out["cpus"] = std::thread::hardware_concurrency();
  out["cpu"] = o.cpu ? json(*o.cpu) : json(nullptr);
  out["results"] = json::array();
  for (size_t k = 0; k < paths.size(); ++k) {
    for (size_t s = 0; s < frames.size(); ++s) {
      const Throughput& t = tp[k][s];
      const Latency& l = lat[k][s];
      std::vector<uint64_t> one_way(l.rtt_ns.size());
      std::transform(l.rtt_ns.begin(), l.rtt_ns.end(), one_way.begin(),
                     [](uint64_t r) { return r / 2; });
      const uint64_t lost = t.sent - std::min(t.sent, t.delivered);
      json r = {{"path", paths[k].name},
                {"rules", paths[k].rules},
                {"via_switch", paths[k].sw != nullptr},
                {"payload", frames[s].payload},
                {"frame_bytes", frames[s].frame_bytes()},
                {"sent", t.sent},
                {"delivered", t.delivered},
                {"lost", lost},
                {"loss", t.sent ? static_cast<double>(lost) / static_cast<double>(t.sent) : 0.0},
                {"wrong_size", t.wrong_size},
                {"send_s", t.send_s},
                {"deliver_s", t.deliver_s},
                {"sent_per_s", t.send_s > 0 ? static_cast<double>(t.sent) / t.send_s : 0.0},
                {"delivered_per_s",
                 t.deliver_s > 0 ? static_cast<double>(t.delivered) / t.deliver_s : 0.0}};
      if (paths[k].sw) {
        r["switch_received"] = t.switch_received;
        r["switch_dropped"] = t.switch_dropped;
        r["switch_send_errors"] = t.switch_send_errors;
        r["switch_flooded"] = t.switch_flooded;
      }
      r["latency"] = {{"round_trips", l.rtt_ns.size()},
                      {"timeouts", l.timeouts},
                      {"stale", l.stale},
                      {"rtt_median_us", percentile_us(l.rtt_ns, 0.5)},
                      {"rtt_p99_us", percentile_us(l.rtt_ns, 0.99)},
                      {"one_way_median_us", percentile_us(one_way, 0.5)},
                      {"one_way_p99_us", percentile_us(one_way, 0.99)},
                      {"one_way_min_us", percentile_us(one_way, 0.0)}};
      out["results"].push_back(std::move(r));
    }
  }
  out["switch_counters"] = {{sw0.name(), ctl0.request({{"op", "counters"}})["counters"]},
                            {swn.name(), ctln.request({{"op", "counters"}})["counters"]}};
  out["elapsed_s"] = static_cast<double>(now_ns() - start) / 1e9;
  std::printf("%s\n", out.dump(1).c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  ::signal(SIGPIPE, SIG_IGN);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdmalab_bench_switch: error: %s\n", e.what());
    return 1;
  }
}
