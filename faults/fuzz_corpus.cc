// Writes the fuzzer's seed corpus into a directory: the real frames of corpus/*.hex and the
// frames the tests build (test_frames.h), one raw file each.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "faults/test_frames.h"

namespace fs = std::filesystem;
using namespace rdmalab::faults::testing;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  fs::create_directories(out);
  const auto write = [&](const std::string& name, const Frame8& f) {
    std::ofstream(out / (name + ".bin"), std::ios::binary)
        .write(reinterpret_cast<const char*>(f.data()), static_cast<std::streamsize>(f.size()));
  };
  int n = 0;
  for (const auto& e : fs::directory_iterator(RDMALAB_FAULTS_CORPUS)) {
    if (e.path().extension() != ".hex") continue;
    write(e.path().stem().string(), load_hex(e.path()));
    ++n;
  }
  Frame8 two = fpdu_send(5, 1);
  const Frame8 second = fpdu_send(10, 2, true);
  two.insert(two.end(), second.begin(), second.end());
  const std::pair<const char*, Frame8> built[] = {{"built_send_only", send_only_to_0x12()},
                                                  {"built_cm_drep", cm_drep()},
                                                  {"built_rnr_nak", rnr_nak()},
                                                  {"built_ud_send_udp_checksum", ud_send(true)},
                                                  {"built_tcp_syn", tcp_syn()},
                                                  {"built_tcp_fin_ack", tcp_fin_ack()},
                                                  {"built_mpa_request", mpa_request()},
                                                  {"built_fpdu_send_crc", fpdu_send_frame(true)},
                                                  {"built_two_fpdus", fpdu_segment(two)}};
  for (const auto& [name, f] : built) {
    write(name, f);
    ++n;
  }
  std::printf("fuzz corpus: %d frames in %s\n", n, out.c_str());
  return 0;
}
