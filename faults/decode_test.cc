// The pcap reader and --decode-pcap: frames the switch's writer (and a tcpdump-style big-endian
// nanosecond file) wrote come back with their time stamps and the parser's summary.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "faults/frame.h"
#include "faults/pcap.h"
#include "faults/test_frames.h"

namespace rdmalab::faults {
namespace {

using namespace testing;
using nlohmann::json;

std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         (name + "-" + std::to_string(::getpid()) + ".pcap");
}

std::vector<json> lines_of(const std::string& text) {
  std::vector<json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

TEST(DecodePcap, FramesTheSwitchWroteComeBackWithTimeAndSummary) {
  const auto path = temp_file("decode");
  {
    PcapWriter w(path.string());
    const Frame8 drep = cm_drep(), fpdu = fpdu_send_frame();
    ASSERT_TRUE(w.write(Bytes(drep.data(), drep.size()), timespec{1700000000, 123456789}));
    ASSERT_TRUE(w.write(Bytes(fpdu.data(), fpdu.size()), timespec{1700000001, 5000}));
  }
  std::ostringstream out;
  EXPECT_EQ(decode_pcap(path.string(), out), 2u);
  const auto lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["i"], 0);
  EXPECT_EQ(lines[0]["t_ns"], 1700000000123456000ull);  // the writer keeps microseconds
  EXPECT_EQ(lines[0]["frame"]["cm"], "DREP");
  EXPECT_EQ(lines[0]["frame"]["src"], "52:54:00:12:34:01");
  EXPECT_EQ(lines[1]["frame"]["proto"], "iwarp");
  EXPECT_EQ(lines[1]["frame"]["rdmap_opcode"], "SEND");
  EXPECT_EQ(lines[2]["end"], true);
  EXPECT_EQ(lines[2]["frames"], 2);
  EXPECT_EQ(lines[2]["torn"], false);

  std::ostringstream capped;  // --max-frames: the rest counted, not decoded
  EXPECT_EQ(decode_pcap(path.string(), capped, 1), 1u);
  const auto c = lines_of(capped.str());
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1]["frames"], 2);
  EXPECT_EQ(c[1]["decoded"], 1);
  std::filesystem::remove(path);
}

TEST(DecodePcap, ReadsBigEndianNanosecondFilesAndStopsAtATornRecord) {
  const auto path = temp_file("decode-be");
  Buf b;
  b.u32(0xA1B23C4D).u16(2).u16(4).u32(0).u32(0).u32(65536).u32(1);  // big-endian, ns
  const Frame8 drep = cm_drep();
  b.u32(1700000000).u32(999).u32(static_cast<uint32_t>(drep.size()))
      .u32(static_cast<uint32_t>(drep.size())).bytes(drep);
  b.u32(1700000002).u32(0).u32(100).u32(100).zeros(10);  // cut off by the writer
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.b.data()), static_cast<std::streamsize>(b.b.size()));
  std::ostringstream out;
  EXPECT_EQ(decode_pcap(path.string(), out), 1u);
  const auto lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["t_ns"], 1700000000000000999ull);
  EXPECT_EQ(lines[0]["frame"]["cm"], "DREP");
  EXPECT_EQ(lines[1]["torn"], true);
  std::filesystem::remove(path);
}

TEST(DecodePcap, RefusesWhatIsNotAnEthernetPcap) {
  const auto path = temp_file("decode-bad");
  std::ofstream(path) << "this is not a pcap file at all";
  std::ostringstream out;
  try {
    decode_pcap(path.string(), out);
    FAIL() << "no error for a text file";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not a classic pcap file"), std::string::npos) << e.what();
  }
  Buf b;  // a valid header of link type 101 (raw IP)
  b.u32(0xA1B2C3D4).u16(2).u16(4).u32(0).u32(0).u32(65536).u32(101);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(b.b.data()), static_cast<std::streamsize>(b.b.size()));
  try {
    decode_pcap(path.string(), out);
    FAIL() << "no error for link type 101";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not Ethernet"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace rdmalab::faults
