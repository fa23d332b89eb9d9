#include "topology/load.h"

#include <cerrno>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "topology/hwloc_import.h"
#include "topology/nccl_xml.h"
#include "topology/xml_text.h"

namespace braid::topo {

const char* formatName(FileFormat format) {
  switch (format) {
    case FileFormat::NcclTopology: return "NCCL topology XML";
    case FileFormat::NcclGraph: return "NCCL graph XML";
    case FileFormat::Hwloc: return "hwloc XML";
  }
  return "?";
}

std::string readFile(const std::string& path) {
  constexpr std::streamoff kMaxBytes = 64 << 20;  // topology files are kilobytes
  std::ifstream in(path, std::ios::binary);
  if (!in) failErrno(braidInvalidArgument, path + ": cannot open", errno);
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  if (size > kMaxBytes)
    fail(braidInvalidArgument, "{}: {} bytes; expected a topology file of at most {} MiB", path,
         size, kMaxBytes >> 20);
  in.seekg(0);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) failErrno(braidSystemError, path + ": read failed", errno);
  return text.str();
}

FileFormat detectFormat(std::string_view text, const std::string& origin) {
  XmlText xml(text, origin);
  std::string root = xml.root().name();
  if (root == "system") return FileFormat::NcclTopology;
  if (root == "graphs") return FileFormat::NcclGraph;
  if (root == "topology") return FileFormat::Hwloc;
  fail(braidInvalidArgument,
       "{}: root element is <{}>; expected <system> (NCCL topology XML), <graphs> (NCCL graph XML) "
       "or <topology> (hwloc XML)",
       xml.where(xml.root()), root);
}

Topology loadTopology(const std::string& path) {
  std::string text = readFile(path);
  switch (detectFormat(text, path)) {
    case FileFormat::NcclTopology: return readNcclXml(text, path);
    case FileFormat::Hwloc: return readHwlocXml(text, path);
    case FileFormat::NcclGraph: break;
  }
  fail(braidInvalidArgument,
       "{}: an NCCL graph file (the channels NCCL's search chose) holds no topology; expected an "
       "NCCL topology or hwloc XML file",
       path);
}

}  // namespace braid::topo
