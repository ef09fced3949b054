// rdmalab-switch: the VM lab's fabric switch with fault rules (switch.h). A drop-in for
// bindings/rdmalab/machines/vmlab/switch.py: --sock PATH [--peer PATH ...] [--pcap FILE] [--keep], plus
// --control PATH (the rule socket) and --seed N (the probability rules' generator).
// --decode-pcap FILE [--max-frames N]: no switch; prints the parser's summary of each frame of a
// capture, one JSON line each (decode_pcap, pcap.h), for a scenario's evidence.
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>

#include "faults/switch.h"

namespace {

using rdmalab::faults::Fd;
using rdmalab::faults::Switch;
using rdmalab::faults::SwitchOptions;

constexpr const char* kUsage =
    "usage: rdmalab-switch --sock PATH [--peer PATH ...] [--pcap FILE] [--control PATH]\n"
    "                      [--seed N] [--keep]\n"
    "       rdmalab-switch --decode-pcap FILE [--max-frames N]\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "%srdmalab-switch: error: %s\n", kUsage, msg.c_str());
  std::exit(2);
}

uint64_t parse_uint(const std::string& opt, const std::string& s) {
  char* end = nullptr;
  errno = 0;
  const uint64_t v = std::strtoull(s.c_str(), &end, 0);
  if (s.empty() || *end != '\0' || errno != 0 || s[0] == '-')
    usage_error(opt + ": expected an unsigned integer, got '" + s + "'");
  return v;
}

struct Decode {
  std::string pcap;  // --decode-pcap: "" = run the switch
  uint64_t max_frames = 0;
};

// argparse's forms: "--opt VALUE" and "--opt=VALUE".
SwitchOptions parse_args(int argc, char** argv, bool& keep, Decode& decode) {
  SwitchOptions o;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
      arg = arg.substr(0, eq);
      has_value = true;
    }
    const auto next = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) usage_error(std::string(arg) + ": expected one argument");
      return argv[++i];
    };
    if (arg == "--sock") {
      o.sock = next();
    } else if (arg == "--peer") {
      o.peers.push_back(next());
    } else if (arg == "--pcap") {
      o.pcap = next();
    } else if (arg == "--control") {
      o.control = next();
    } else if (arg == "--seed") {
      o.seed = parse_uint("--seed", next());
    } else if (arg == "--decode-pcap") {
      decode.pcap = next();
    } else if (arg == "--max-frames") {
      decode.max_frames = parse_uint("--max-frames", next());
    } else if (arg == "--keep" && !has_value) {
      keep = true;
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      usage_error("unrecognized argument: " + std::string(argv[i]));
    }
  }
  if (!decode.pcap.empty()) {
    if (!o.sock.empty() || !o.control.empty() || !o.peers.empty() || !o.pcap.empty())
      usage_error("--decode-pcap runs no switch: no --sock, --peer, --pcap or --control");
    return o;
  }
  if (decode.max_frames != 0) usage_error("--max-frames goes with --decode-pcap");
  if (o.sock.empty()) usage_error("the following argument is required: --sock");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  bool keep = false;
  Decode decode;
  SwitchOptions o = parse_args(argc, argv, keep, decode);
  if (!decode.pcap.empty()) {
    try {
      rdmalab::faults::decode_pcap(decode.pcap, std::cout, decode.max_frames);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rdmalab-switch: %s\n", e.what());
      return 1;
    }
    std::cout.flush();
    return std::cout ? 0 : 1;
  }
  // SIGTERM and SIGINT arrive through a signalfd in the poll loop: a clean stop between frames.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  Fd sfd(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sfd) {
    std::perror("rdmalab-switch: signalfd");
    return 1;
  }
  o.stop_fd = sfd.get();
  if (!keep) o.parent = getppid();  // the controller gone: stop, as switch.py does
  try {
    Switch sw(o);
    std::printf("switch: listening on %s\n", o.sock.c_str());
    if (!o.control.empty()) std::printf("switch: control on %s\n", o.control.c_str());
    std::fflush(stdout);
    sw.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdmalab-switch: %s\n", e.what());
    return 1;
  }
  return 0;
}
