#include "faults/switch.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <system_error>

#include "faults/corrupt.h"

namespace rdmalab::faults {
namespace {

constexpr size_t kMaxFrame = 65536;
constexpr size_t kEthHeader = 14;
constexpr int kFramesPerRound = 256;  // then look at the control socket and the timers again
constexpr uint64_t kOrphanCheckNs = 1'000'000'000;

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

sockaddr_un unix_addr(const std::string& path, socklen_t& len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof a.sun_path)
    throw std::system_error(ENAMETOOLONG, std::generic_category(), "unix socket path " + path);
  std::memcpy(a.sun_path, path.data(), path.size());
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return a;
}

// A leftover socket from an earlier run is removed; anything else at the path is an error.
void remove_stale_socket(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (!S_ISSOCK(st.st_mode))
    throw std::system_error(EEXIST, std::generic_category(), path + " exists, not a socket");
  ::unlink(path.c_str());
}

Fd bound_socket(const std::string& path, int type) {
  socklen_t len = 0;
  const sockaddr_un a = unix_addr(path, len);
  Fd fd(::socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno("socket");
  remove_stale_socket(path);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), len) != 0)
    throw_errno("bind " + path);
  return fd;
}

bool peer_is_down(int err) {
  return err == ECONNREFUSED || err == ENOENT || err == EAGAIN || err == EWOULDBLOCK ||
         err == ENOBUFS;
}

// The flow a reorder waits on: the QP for RoCE, the connection for TCP, else the MAC pair.
std::string flow_key(const Frame& f, const std::vector<uint8_t>& frame) {
  std::string k;
  if (f.ip) {
    const size_t n = f.ip->version == 6 ? 16 : 4;
    k.append(reinterpret_cast<const char*>(f.ip->src.data()), n);
    k.append(reinterpret_cast<const char*>(f.ip->dst.data()), n);
    if (f.bth) return "r" + k + std::to_string(f.bth->dest_qpn);
    if (f.tcp)
      return "t" + k + std::to_string(f.tcp->src_port) + ":" + std::to_string(f.tcp->dst_port);
    return "i" + k + std::to_string(f.ip->protocol);
  }
  return "e" + std::string(frame.begin(), frame.begin() + kEthHeader);
}

}  // namespace

uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

Switch::Switch(SwitchOptions o) : o_(std::move(o)), rules_(o_.seed) {
  // The control socket first: once the data socket exists (what the lab waits for), both are up.
  if (!o_.control.empty()) {
    listen_ = bound_socket(o_.control, SOCK_STREAM);
    bound_.push_back(o_.control);
    if (::listen(listen_.get(), 16) != 0) throw_errno("listen " + o_.control);
  }
  if (!o_.pcap.empty()) pcap_.emplace(o_.pcap);
  data_ = bound_socket(o_.sock, SOCK_DGRAM);
  bound_.push_back(o_.sock);
  for (const std::string& p : o_.peers)
    if (std::find(peers_.begin(), peers_.end(), p) == peers_.end()) peers_.push_back(p);
}

Switch::~Switch() {
  for (const std::string& p : bound_) ::unlink(p.c_str());
}

void Switch::run() {
  while (!stopped_) poll_once(UINT64_MAX);
  shutdown();
}

// Frames still kept when the switch stops are dropped, not sent: sending them now would cut
// the delay or undo the reorder the rule asked for, and the peers are going away with the
// switch. Each still gets its release record, so every delay and reorder record has exactly
// one; nobody reads the history of a stopping switch, hence the line on stderr too.
void Switch::shutdown() {
  if (pending_.empty()) return;
  const uint64_t now = monotonic_ns();
  for (const auto& [due, id] : timers_)  // in the order they were due to leave
    note_release(pending_.at(id), Release::kShutdown, now);
  std::fprintf(stderr, "switch: %zu delayed or held frame(s) dropped at shutdown\n",
               pending_.size());
  timers_.clear();
  pending_.clear();
  held_.clear();
}

uint64_t Switch::next_timeout_ns(uint64_t max_wait_ns, uint64_t now_ns) const {
  uint64_t wait = max_wait_ns;
  if (!timers_.empty()) {
    const uint64_t due = timers_.begin()->first;
    wait = std::min(wait, due > now_ns ? due - now_ns : 0);
  }
  if (o_.parent != 0) wait = std::min(wait, kOrphanCheckNs);
  return wait;
}

void Switch::poll_once(uint64_t max_wait_ns) {
  std::vector<pollfd> fds = {{data_.get(), POLLIN, 0}};
  const size_t listen_at = fds.size();
  if (listen_) fds.push_back({listen_.get(), POLLIN, 0});
  const size_t stop_at = fds.size();
  if (o_.stop_fd >= 0) fds.push_back({o_.stop_fd, POLLIN, 0});
  const size_t clients_at = fds.size();
  for (const auto& c : clients_) {
    short ev = c->read_closed || c->close_after_flush ? 0 : POLLIN;
    if (!c->out.empty()) ev |= POLLOUT;
    fds.push_back({c->fd.get(), ev, 0});
  }
  const uint64_t wait = next_timeout_ns(max_wait_ns, monotonic_ns());
  timespec ts{};
  const timespec* tsp = nullptr;
  if (wait != UINT64_MAX) {
    ts.tv_sec = static_cast<time_t>(wait / 1'000'000'000ull);
    ts.tv_nsec = static_cast<long>(wait % 1'000'000'000ull);
    tsp = &ts;
  }
  if (::ppoll(fds.data(), fds.size(), tsp, nullptr) < 0 && errno != EINTR) throw_errno("ppoll");

  if (o_.stop_fd >= 0 && fds[stop_at].revents != 0) stopped_ = true;
  if (fds[0].revents != 0) pump_data();
  if (listen_ && fds[listen_at].revents != 0) accept_clients();
  const size_t n_clients = fds.size() - clients_at;  // accept_clients may have added more
  for (size_t i = 0; i < n_clients; ++i) {
    Client& c = *clients_[i];
    const short re = fds[clients_at + i].revents;
    if (re & (POLLIN | POLLHUP | POLLERR)) read_client(c);
    if (!c.out.empty() && c.fd) write_client(c);
  }
  std::erase_if(clients_, [](const std::unique_ptr<Client>& c) {
    return !c->fd || ((c->read_closed || c->close_after_flush) && c->out.empty());
  });
  fire_timers(monotonic_ns());
  if (o_.parent != 0 && ::getppid() != o_.parent) stopped_ = true;
}

void Switch::pump_data() {
  std::vector<uint8_t> buf(kMaxFrame);
  for (int i = 0; i < kFramesPerRound; ++i) {
    sockaddr_un from{};
    socklen_t from_len = sizeof from;
    const ssize_t n = ::recvfrom(data_.get(), buf.data(), buf.size(), MSG_DONTWAIT,
                                 reinterpret_cast<sockaddr*>(&from), &from_len);
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        std::fprintf(stderr, "switch: recvfrom: %s\n", std::strerror(errno));
      return;
    }
    const size_t path_len =
        from_len > offsetof(sockaddr_un, sun_path) ? from_len - offsetof(sockaddr_un, sun_path) : 0;
    // A path name ends at its NUL; an abstract name (leading NUL) is the whole address.
    std::string sender(from.sun_path, path_len);
    if (!sender.empty() && sender[0] != '\0') sender.resize(std::strlen(sender.c_str()));
    std::vector<uint8_t> frame(buf.begin(), buf.begin() + n);
    if (pcap_) {
      timespec now{};
      clock_gettime(CLOCK_REALTIME, &now);
      if (!pcap_->write(frame, now) && fwd_.pcap_errors++ == 0)
        std::fprintf(stderr, "switch: pcap %s: write failed, capture stopped\n",
                     pcap_->path().c_str());
    }
    on_frame(std::move(frame), std::move(sender));
  }
}

void Switch::on_frame(std::vector<uint8_t> frame, std::string sender) {
  ++fwd_.received;
  if (sender.empty()) {  // an unbound sender cannot be learned nor answered
    ++fwd_.no_sender;
    return;
  }
  if (frame.size() < kEthHeader) {
    rules_.count_unroutable();
    return;
  }
  learn(frame, sender);
  const Frame f = parse(frame);
  const uint64_t now = monotonic_ns();
  const std::optional<Decision> d = rules_.decide(f, now);
  const uint64_t seq = ++recv_seq_;
  std::string flow = flow_key(f, frame);
  if (!d) return forward(frame, sender, flow, seq, now);
  switch (d->action) {
    case Action::kWatch:  // decide() never returns one
    case Action::kDrop:
      return;
    case Action::kDelay:
    case Action::kReorder:
      return schedule(std::move(frame), std::move(sender), std::move(flow), seq, now, *d);
    case Action::kDuplicate:
      deliver(frame, sender);
      return forward(frame, sender, flow, seq, now);
    case Action::kCorrupt: {
      const CorruptResult r = corrupt(frame, f, d->corrupt);
      rules_.annotate_last("corrupted",
                           {{"frame_offset", r.frame_offset}, {"recomputed", r.recomputed}});
      return forward(frame, sender, flow, seq, now);
    }
  }
}

void Switch::learn(const std::vector<uint8_t>& frame, const std::string& sender) {
  if (std::find(peers_.begin(), peers_.end(), sender) == peers_.end()) peers_.push_back(sender);
  Mac src;
  std::copy(frame.begin() + 6, frame.begin() + 12, src.begin());
  if (!(src[0] & 1)) table_[src] = sender;  // a multicast source address is bogus: never learn it
}

std::vector<std::string> Switch::destinations(const std::vector<uint8_t>& frame,
                                              const std::string& sender) {
  Mac dst;
  std::copy(frame.begin(), frame.begin() + 6, dst.begin());
  if (!(dst[0] & 1)) {
    const auto it = table_.find(dst);
    if (it != table_.end()) {
      if (it->second == sender) return {};
      return {it->second};
    }
  }
  ++fwd_.flooded;
  std::vector<std::string> out;
  for (const std::string& p : peers_)
    if (p != sender) out.push_back(p);
  return out;
}

void Switch::deliver(const std::vector<uint8_t>& frame, const std::string& sender) {
  for (const std::string& out : destinations(frame, sender)) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const size_t n = std::min(out.size(), sizeof a.sun_path - 1);
    std::memcpy(a.sun_path, out.data(), n);
    const auto len =
        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n + (out[0] == '\0' ? 0 : 1));
    if (::sendto(data_.get(), frame.data(), frame.size(), MSG_DONTWAIT,
                 reinterpret_cast<const sockaddr*>(&a), len) >= 0) {
      ++fwd_.sent;
    } else if (peer_is_down(errno)) {
      ++fwd_.peer_down;  // a VM that is down or rebooting: skip it (vmlab.md)
    } else {
      ++fwd_.send_errors;
      std::fprintf(stderr, "switch: sendto %s: %s\n", out.c_str(), std::strerror(errno));
    }
  }
}

void Switch::forward(const std::vector<uint8_t>& frame, const std::string& sender,
                     const std::string& flow, uint64_t recv_seq, uint64_t now_ns) {
  deliver(frame, sender);
  release_held(flow, recv_seq, now_ns);
}

void Switch::schedule(std::vector<uint8_t> frame, std::string sender, std::string flow,
                      uint64_t recv_seq, uint64_t now_ns, const Decision& d) {
  const bool held = d.action == Action::kReorder;
  const uint64_t id = next_pending_++;
  if (held) held_[flow].push_back(id);
  Pending p{.frame = std::move(frame),
            .sender = std::move(sender),
            .flow = std::move(flow),
            .recv_seq = recv_seq,
            .held = held,
            .rule = d.rule_id,
            .of_seq = d.record_seq,
            .since_ns = now_ns,
            // Equal due times keep their order.
            .timer = timers_.emplace(now_ns + (held ? d.hold_ns : d.delay_ns), id)};
  pending_.emplace(id, std::move(p));
}

void Switch::note_release(const Pending& p, Release why, uint64_t now_ns) {
  const char* reason = "?";
  switch (why) {
    case Release::kDelayElapsed:
      reason = "delay_elapsed";
      ++fwd_.delay_elapsed;
      break;
    case Release::kNextFrame:
      reason = "next_frame";
      ++fwd_.next_frame;
      break;
    case Release::kHoldDeadline:
      reason = "hold_deadline";
      ++fwd_.hold_deadline;
      break;
    case Release::kShutdown:
      reason = "dropped_at_shutdown";
      ++fwd_.dropped_at_shutdown;
      break;
  }
  if (why != Release::kShutdown) ++fwd_.released;
  rules_.record_release(p.rule, p.of_seq, reason, now_ns - p.since_ns, now_ns);
}

// A frame of the flow passed: frames held before it go right after it, in their order.
void Switch::release_held(const std::string& flow, uint64_t before_seq, uint64_t now_ns) {
  const auto it = held_.find(flow);
  if (it == held_.end()) return;
  std::vector<uint64_t> keep;
  for (uint64_t id : it->second) {
    auto p = pending_.find(id);
    if (p->second.recv_seq >= before_seq) {
      keep.push_back(id);
      continue;
    }
    timers_.erase(p->second.timer);
    note_release(p->second, Release::kNextFrame, now_ns);
    deliver(p->second.frame, p->second.sender);
    pending_.erase(p);
  }
  if (keep.empty()) {
    held_.erase(it);
  } else {
    it->second = std::move(keep);
  }
}

void Switch::fire_timers(uint64_t now_ns) {
  while (!timers_.empty() && timers_.begin()->first <= now_ns) {
    const uint64_t id = timers_.begin()->second;
    timers_.erase(timers_.begin());
    auto node = pending_.extract(id);
    Pending& p = node.mapped();
    if (p.held) {
      auto& ids = held_[p.flow];
      std::erase(ids, id);
      if (ids.empty()) held_.erase(p.flow);
    }
    // Recorded before forward(): frames it lets go after it are recorded after it.
    note_release(p, p.held ? Release::kHoldDeadline : Release::kDelayElapsed, now_ns);
    forward(p.frame, p.sender, p.flow, p.recv_seq, now_ns);
  }
}

}  // namespace rdmalab::faults
