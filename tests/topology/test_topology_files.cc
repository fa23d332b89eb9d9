// Every shared topology file loads and prints; NCCL dumps round-trip; malformed input gives an
// error that names the file, the line and what was expected.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "topology/hwloc_import.h"
#include "topology/load.h"
#include "topology/nccl_xml.h"
#include "topology/paths.h"
#include "topology/report.h"

namespace braid::topo {
namespace {

namespace fs = std::filesystem;
const fs::path kXml = fs::path(BRAID_SHARED_TOPOLOGIES) / "xml";

std::vector<fs::path> sharedXmlFiles() {
  std::vector<fs::path> files;
  if (fs::is_directory(kXml))
    for (const auto& entry : fs::directory_iterator(kXml))
      if (entry.path().extension() == ".xml") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

#define SKIP_WITHOUT_SHARED()  \
  if (!fs::is_directory(kXml)) \
  GTEST_SKIP() << "no " << kXml << " (../shared/topologies is not here)"

TEST(Files, EveryFileLoadsAndPrints) {
  SKIP_WITHOUT_SHARED();
  std::vector<fs::path> files = sharedXmlFiles();
  ASSERT_GE(files.size(), 20u);
  for (const fs::path& file : files) {
    SCOPED_TRACE(file.string());
    std::string text = readFile(file);
    if (detectFormat(text, file) == FileFormat::NcclGraph) {
      std::vector<NcclGraph> graphs = readNcclGraphXml(text, file);
      ASSERT_FALSE(graphs.empty());
      std::ostringstream out;
      printGraphs(out, file, graphs);
      EXPECT_NE(out.str().find("channel 0: "), std::string::npos) << out.str();
      EXPECT_TRUE(nlohmann::json::parse(graphsToJson(file, graphs)).contains("graphs"));
      continue;
    }
    if (detectFormat(text, file) == FileFormat::Hwloc && !haveHwloc()) continue;
    Topology topology = loadTopology(file);
    Matrix matrix = computeMatrix(topology);
    std::ostringstream out;
    printAllViews(out, topology, matrix);
    // A file with GPUs prints nvidia-smi's header; one without says so plainly.
    if (gpuNodes(topology).empty())
      EXPECT_NE(out.str().find("No GPU in " + file.string()), std::string::npos);
    else
      EXPECT_EQ(out.str().rfind("\tGPU0\t", 0), 0u) << out.str().substr(0, 200);
    nlohmann::json json = nlohmann::json::parse(toJson(topology, matrix));
    EXPECT_EQ(json["matrix"]["labels"].size(), matrix.endpoints.size());
    // What braid dumps, NCCL's format reads back.
    EXPECT_NO_THROW(readNcclXml(writeNcclXml(topology), "dump.xml"));
  }
}

// A NIC known by its <nic> element alone: no port NCCL keeps (a <net> without dev) and a class
// whose base is not 0x02 read as a number (0x0200002 is 0x200002). Its dump must keep the empty
// <nic>, or the dump reads back without that NIC (found by fuzz_nccl_xml: the writer decided by
// the class's text, the reader by its value).
TEST(Files, NcclDumpKeepsANicItsClassDoesNotName) {
  const std::string text = R"(<system version="1">
  <cpu numaid="0" affinity="0000ffff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:d5:00.0" class="0x0200002" link_speed="32.0 GT/s PCIe" link_width="16">
      <nic><net name="mlx5_9" speed="200000" port="1"/></nic>
    </pci>
    <pci busid="0000:d6:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16">
      <gpu dev="0" sm="90" rank="0" gdr="1"/>
    </pci>
  </cpu>
</system>)";
  const Topology original = readNcclXml(text, "nic.xml");
  const Matrix before = computeMatrix(original);
  ASSERT_EQ(before.endpoints.size(), 2u);  // GPU0 and the NIC
  const std::string dump = writeNcclXml(original);
  const Matrix after = computeMatrix(readNcclXml(dump, "dump.xml"));
  ASSERT_EQ(after.endpoints.size(), 2u) << dump;
  EXPECT_EQ(after.endpoints[1].label, before.endpoints[1].label);
  EXPECT_EQ(classLabel(after.paths[0][1]), classLabel(before.paths[0][1]));
}

// A NIC with no port, a class that says NIC, and a <pci> inside: the reader takes a device with
// <pci> inside and no <nic> for a bridge, so its dump must keep the empty <nic> (found by
// fuzz_nccl_xml, minimized).
TEST(Files, NcclDumpKeepsANicWithDevicesInside) {
  const std::string text = R"(<system version="1"><cpu>
    <pci busid="0000:0a:00.0" class="0x020000"><pci busid="0000:0b:00.0"/><nic></nic></pci>
  </cpu></system>)";
  const Topology original = readNcclXml(text, "nic.xml");
  const Matrix before = computeMatrix(original);
  ASSERT_EQ(before.endpoints.size(), 1u);  // the NIC
  const std::string dump = writeNcclXml(original);
  const Matrix after = computeMatrix(readNcclXml(dump, "dump.xml"));
  ASSERT_EQ(after.endpoints.size(), 1u) << dump;
  EXPECT_EQ(after.endpoints[0].label, before.endpoints[0].label);
}

// Load an NCCL file, dump it, load the dump: the same endpoints, classes and bandwidths.
TEST(Files, NcclDumpRoundTrips) {
  SKIP_WITHOUT_SHARED();
  int tried = 0;
  for (const fs::path& file : sharedXmlFiles()) {
    std::string text = readFile(file);
    if (detectFormat(text, file) != FileFormat::NcclTopology) continue;
    SCOPED_TRACE(file.string());
    ++tried;
    Topology original = readNcclXml(text, file);
    std::string dump = writeNcclXml(original);
    Topology again = readNcclXml(dump, "dump.xml");
    Matrix before = computeMatrix(original), after = computeMatrix(again);
    ASSERT_EQ(before.endpoints.size(), after.endpoints.size()) << dump;
    for (size_t r = 0; r < before.endpoints.size(); ++r) {
      EXPECT_EQ(before.endpoints[r].label, after.endpoints[r].label);
      EXPECT_EQ(before.endpoints[r].name, after.endpoints[r].name);
      EXPECT_EQ(original.nodes[before.endpoints[r].node].busId,
                again.nodes[after.endpoints[r].node].busId);
      for (size_t c = 0; c < before.endpoints.size(); ++c) {
        const Path& a = before.paths[r][c];
        const Path& b = after.paths[r][c];
        EXPECT_EQ(classLabel(a), classLabel(b)) << r << "," << c;
        EXPECT_EQ(a.bandwidthGBs, b.bandwidthGBs) << r << "," << c;
        EXPECT_EQ(a.estimated, b.estimated) << r << "," << c;
      }
    }
    // And the dump is a fixed point: dumping what was read from a dump changes nothing.
    EXPECT_EQ(writeNcclXml(again), dump);
  }
  EXPECT_GE(tried, 15);
}

// An hwloc tree written as NCCL XML loses its host bridges (NCCL's format has none): NODE becomes
// PHB and nothing else changes; root and downstream ports are left out as NCCL leaves them out.
TEST(Files, HwlocToNcclKeepsClassesButNode) {
  SKIP_WITHOUT_SHARED();
  if (!haveHwloc()) GTEST_SKIP() << "built without hwloc";
  for (const char* name : {"hwloc_nvidia_dgx2h.xml", "hwloc_hp_sl390s_g7_3gpu_ib.xml"}) {
    SCOPED_TRACE(name);
    Topology hwloc = loadTopology(kXml / name);
    for (Node& node : hwloc.nodes) node.gpu.links.clear();  // compare the PCIe classes
    Topology nccl = readNcclXml(writeNcclXml(hwloc), "dump.xml");
    Matrix before = computeMatrix(hwloc), after = computeMatrix(nccl);
    ASSERT_EQ(before.endpoints.size(), after.endpoints.size());
    for (size_t r = 0; r < before.endpoints.size(); ++r)
      for (size_t c = 0; c < before.endpoints.size(); ++c) {
        std::string expected = classLabel(before.paths[r][c]);
        if (expected == "NODE") expected = "PHB";
        EXPECT_EQ(classLabel(after.paths[r][c]), expected) << r << "," << c;
      }
  }
}

TEST(Helpers, BusIdsCpuMasksLinkSpeeds) {
  EXPECT_EQ(canonicalBusId("00000000:0F:00.0"), "0000:0f:00.0");  // NVML's form
  EXPECT_EQ(canonicalBusId("0f:00.1"), "0000:0f:00.1");           // lspci's form
  EXPECT_EQ(canonicalBusId("fffffff:ff:1f.0"), "fffffff:ff:1f.0");
  for (const char* bad : {"", "0000:0f:00", "0000:0g:00.0", "0000:0f:000.0", "0000:0f:00.123",
                          "0x00:0f:00.0", "1:2:3:04:00.0", "fffffff:ffff:ff"})
    EXPECT_EQ(canonicalBusId(bad), "") << bad;
  // Linux cpumask: 32-bit words, most significant first.
  std::vector<int> cpus;
  ASSERT_TRUE(parseCpuMask("0000ffff,0000ffff", &cpus));
  EXPECT_EQ(cpuList(cpus), "0-15,32-47");
  EXPECT_EQ(cpuMask(cpus), "0000ffff,0000ffff");
  ASSERT_TRUE(parseCpuMask("c0c0", &cpus));
  EXPECT_EQ(cpuList(cpus), "6-7,14-15");
  EXPECT_FALSE(parseCpuMask("ffff,,ffff", &cpus));
  EXPECT_FALSE(parseCpuMask("123456789", &cpus));
  EXPECT_EQ(cpuList({}), "N/A");
  EXPECT_EQ(parseLinkSpeed("16.0 GT/s PCIe"), 16.0);
  EXPECT_EQ(parseLinkSpeed("8 GT/s"), 8.0);
  EXPECT_EQ(parseLinkSpeed("32 GT/s PCIe/s"), 32.0);
  EXPECT_EQ(parseLinkSpeed("Unknown"), 0.0);
  EXPECT_EQ(parseLinkSpeed(""), 0.0);
  // Per lane: Gen1/2 lose 2 bits in 10, Gen3-5 2 in 130.
  EXPECT_DOUBLE_EQ(laneGBs(2.5), 0.25);
  EXPECT_DOUBLE_EQ(laneGBs(8.0), 8.0 * 128 / 130 / 8);
  EXPECT_DOUBLE_EQ(laneGBs(32.0) * 16, 32.0 * 128 / 130 / 8 * 16);
}

// The braidInvalidArgument message reading `text` as NCCL XML gives; fails the test if it reads.
std::string ncclError(const std::string& text) {
  try {
    readNcclXml(text, "bad.xml");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), braidInvalidArgument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return "";
}

TEST(Malformed, TruncatedFile) {
  std::string message = ncclError(
      "<system version=\"1\">\n"
      "  <cpu numaid=\"0\">\n"
      "    <pci busid=\"0000:01:00.0\" class=\"0x030200\"/>\n");
  EXPECT_NE(message.find("bad.xml:3:49: the file ends inside <cpu> from line 2; expected </cpu>"),
            std::string::npos)
      << message;
}

TEST(Malformed, WrongRootElement) {
  std::string message = ncclError("<graphs version=\"1\"/>\n");
  EXPECT_NE(message.find("bad.xml:1: root element is <graphs>; expected <system"),
            std::string::npos)
      << message;
  try {
    detectFormat("<!-- a comment -->\n<topo/>", "other.xml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("other.xml:2: root element is <topo>; expected <system> "
                                         "(NCCL topology XML), <graphs>"),
              std::string::npos)
        << e.what();
  }
}

TEST(Malformed, TabBetweenTokens) {
  std::string message = ncclError("<system version=\"1\">\n  <cpu\tnumaid=\"0\"/>\n</system>\n");
  EXPECT_NE(message.find("bad.xml:2:7: tab character"), std::string::npos) << message;
  EXPECT_NE(message.find("expected spaces"), std::string::npos) << message;
  // Tabs inside comments and quoted values are no trouble for NCCL's parser.
  EXPECT_NO_THROW(readNcclXml(
      "<!--\t-->\n<system version=\"1\"><cpu numaid=\"0\" vendor=\"a\tb\"/></system>", "ok.xml"));
}

TEST(Malformed, HugeAttribute) {
  std::string message = ncclError("<system version=\"1\">\n<cpu numaid=\"0\">\n<pci busid=\"" +
                                  std::string(300, 'f') + "\"/>\n</cpu>\n</system>\n");
  EXPECT_NE(message.find("bad.xml:3: attribute busid of <pci> is 300 characters long; NCCL allows "
                         "at most 255"),
            std::string::npos)
      << message;
}

TEST(Malformed, UnknownClass) {
  std::string message = ncclError(
      "<system version=\"1\">\n<cpu numaid=\"0\">\n"
      "<pci busid=\"0000:01:00.0\" class=\"GPU\"/>\n</cpu>\n</system>\n");
  EXPECT_NE(message.find("bad.xml:3: <pci busid=\"0000:01:00.0\" class=\"GPU\">: unknown class; "
                         "expected a PCI class code 0xCCSSPP"),
            std::string::npos)
      << message;
}

TEST(Malformed, CycleInThePciTree) {
  std::string message = ncclError(
      "<system version=\"1\">\n<cpu numaid=\"0\">\n"
      "<pci busid=\"0000:02:00.0\" class=\"0x060400\">\n"
      "  <pci busid=\"0000:02:00.0\" class=\"0x030200\"/>\n"
      "</pci>\n</cpu>\n</system>\n");
  EXPECT_NE(
      message.find("bad.xml:4: bus id 0000:02:00.0 is nested inside itself (first at line 3)"),
      std::string::npos)
      << message;
}

TEST(Malformed, DuplicateBusId) {
  std::string message = ncclError(
      "<system version=\"1\">\n<cpu numaid=\"0\">\n"
      "<pci busid=\"0000:03:00.0\" class=\"0x030200\"/>\n</cpu>\n<cpu numaid=\"1\">\n"
      "<pci busid=\"0000:03:00.0\" class=\"0x020700\"/>\n</cpu>\n</system>\n");
  EXPECT_NE(message.find("bad.xml:6: bus id 0000:03:00.0 appears twice (first at line 3)"),
            std::string::npos)
      << message;
  message =
      ncclError("<system version=\"1\">\n<cpu numaid=\"0\"/>\n<cpu numaid=\"0\"/>\n</system>");
  EXPECT_NE(message.find("bad.xml:3: a second <cpu numaid=\"0\"> (first at line 2)"),
            std::string::npos)
      << message;
}

TEST(Malformed, BadValues) {
  std::string head = "<system version=\"1\">\n<cpu numaid=\"0\">\n";
  std::string tail = "\n</cpu>\n</system>\n";
  EXPECT_NE(
      ncclError(head + "<pci busid=\"0000:zz:00.0\"/>" + tail)
          .find("bad.xml:3: <pci busid=\"0000:zz:00.0\">: expected a PCI bus id dddd:bb:dd.f"),
      std::string::npos);
  EXPECT_NE(ncclError(head + "<pci busid=\"0000:01:00.0\"><gpu dev=\"zero\"/></pci>" + tail)
                .find("bad.xml:3: <gpu dev=\"zero\">: expected an integer"),
            std::string::npos);
  EXPECT_NE(ncclError(head + "<pci class=\"0x030200\"/>" + tail)
                .find("bad.xml:3: <pci> without busid; expected busid="),
            std::string::npos);
  EXPECT_NE(ncclError("<system version=\"7\"/>").find("expected version=\"1\""), std::string::npos);
  EXPECT_NE(ncclError("<system version=\"1\"><cpu affinity=\"ffff,zz\"/></system>")
                .find("expected a Linux cpumask"),
            std::string::npos);
  EXPECT_NE(ncclError("").find("bad.xml:1:1: no XML element; expected a root element"),
            std::string::npos);
  EXPECT_NE(ncclError("<system version=\"1\">\n</cpu>\n</system>")
                .find("bad.xml:2:3: not well-formed XML (Start-end tags mismatch)"),
            std::string::npos);
}

TEST(Malformed, DeepNestingIsRefused) {
  std::string text = "<system version=\"1\"><cpu numaid=\"0\">";
  for (int i = 0; i < 100; ++i) text += fmt::format("<pci busid=\"0000:{:02x}:00.0\">", i);
  for (int i = 0; i < 100; ++i) text += "</pci>";
  text += "</cpu></system>";
  EXPECT_NE(ncclError(text).find("expected at most 64 levels"), std::string::npos);
}

TEST(Malformed, HwlocFiles) {
  if (!haveHwloc()) GTEST_SKIP() << "built without hwloc";
  auto hwlocError = [](const std::string& text) -> std::string {
    try {
      readHwlocXml(text, "lstopo.xml");
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "no error for:\n" << text;
    return "";
  };
  std::string truncated = hwlocError(
      "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n  <object type=\"Machine\" "
      "os_index=\"0\">\n");
  EXPECT_NE(truncated.find("lstopo.xml:3:"), std::string::npos) << truncated;
  EXPECT_NE(truncated.find("the file ends inside <object> from line 3; expected </object>"),
            std::string::npos)
      << truncated;
  EXPECT_NE(
      hwlocError("<system version=\"1\"/>").find("root element is <system>; expected <topology>"),
      std::string::npos);
  EXPECT_NE(
      hwlocError("<topology version=\"2.0\">\n<object type=\"Machine\" os_index=\"0\">\n"
                 "<object type=\"NUMANode\" cpuset=\"0x1\"/></object></topology>")
          .find("lstopo.xml:3: <object type=\"NUMANode\"> without os_index; expected os_index="),
      std::string::npos);
  std::string refused =
      hwlocError("<topology version=\"2.0\"><object type=\"Banana\"/></topology>");
  EXPECT_NE(refused.find("lstopo.xml: hwloc"), std::string::npos) << refused;
  EXPECT_NE(refused.find("refused this hwloc XML"), std::string::npos) << refused;
}

// Found by fuzzing: hwloc 2.9 dereferences a NUMA node's missing complete_nodeset. The importer
// runs in a child process, so braid reports it instead of dying with it.
TEST(Malformed, HwlocCrashIsAnError) {
  SKIP_WITHOUT_SHARED();
  if (!haveHwloc()) GTEST_SKIP() << "built without hwloc";
  std::string text = readFile(kXml / "hwloc_nvidia_dgx2h.xml");
  size_t numa = text.find("<object type=\"NUMANode\"");
  ASSERT_NE(numa, std::string::npos);
  size_t attribute = text.find("complete_nodeset", numa);
  text.replace(attribute, std::strlen("complete_nodeset"), "complete_xodeset");
  try {
    readHwlocXml(text, "broken.xml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("broken.xml: hwloc", 0), 0u) << e.what();
  }
}

// Found by fuzzing: names that are not UTF-8 go to JSON replaced, not as an exception; a <nic>
// whose <net>s NCCL would skip still round-trips as a NIC.
TEST(Malformed, OddButReadableInput) {
  Topology topology = readNcclXml(
      "<system version=\"1\"><cpu numaid=\"0\">"
      "<pci busid=\"0000:00:00.0\" class=\"0x060000\"><nic><net name=\"x\"/></nic></pci>"
      "<pci busid=\"0000:01:00.0\" class=\"0x020000\"><nic><net name=\"e\xff\" "
      "dev=\"0\"/></nic></pci>"
      "</cpu></system>",
      "odd.xml");
  Matrix matrix = computeMatrix(topology);
  ASSERT_EQ(matrix.endpoints.size(), 2u);
  EXPECT_NO_THROW(nlohmann::json::parse(toJson(topology, matrix)));
  Topology again = readNcclXml(writeNcclXml(topology), "dump.xml");
  EXPECT_EQ(computeMatrix(again).endpoints.size(), 2u);
}

TEST(Malformed, FilesThatAreNoTopology) {
  try {
    readFile("/nonexistent/topo.xml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/topo.xml: cannot open"), std::string::npos);
  }
  SKIP_WITHOUT_SHARED();
  fs::path graph = kXml / "panlichen_8x_rtx3090_nccl_graph.xml";
  try {
    loadTopology(graph);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds no topology"), std::string::npos) << e.what();
  }
}

// What NCCL's parser takes, braid takes: comments after '>', hex and octal numbers, missing
// attributes, a <pci> with only a bus id, unknown elements skipped.
TEST(Tolerant, NcclQuirks) {
  Topology topology = readNcclXml(
      "<system version=\"1\">  <!-- a comment -->\n"
      "<cpu numaid=\"0\" arch=\"x86_64\">\n"
      "  <pci busid=\"0000:0A:00.0\" class=\"0x030000\" link_speed=\"\" link_width=\"0\">\n"
      "    <gpu dev=\"0x1\" sm=\"010\"><nvlink target=\"0000:0b:00.0\" count=\"2\" "
      "tclass=\"0x030000\"/></gpu>\n"
      "  </pci>\n"
      "  <pci busid=\"0000:0b:00.0\" class=\"0x030000\"><gpu dev=\"0\"/></pci>\n"
      "  <pci busid=\"0000:0c:00.0\"/>\n"
      "  <frobnicator/>\n"
      "</cpu>\n</system>\n",
      "quirks.xml");
  Matrix matrix = computeMatrix(topology);
  ASSERT_EQ(matrix.endpoints.size(), 2u);
  EXPECT_EQ(matrix.endpoints[0].label, "GPU0");
  EXPECT_EQ(topology.nodes[matrix.endpoints[1].node].busId, "0000:0a:00.0");  // dev 0x1
  EXPECT_EQ(topology.nodes[matrix.endpoints[1].node].gpu.sm, 8);              // octal 010
  EXPECT_EQ(classLabel(matrix.paths[0][1]), "NV2");
  ASSERT_FALSE(topology.notes.empty());
  EXPECT_NE(topology.notes.back().find("<frobnicator>"), std::string::npos);
}

}  // namespace
}  // namespace braid::topo
