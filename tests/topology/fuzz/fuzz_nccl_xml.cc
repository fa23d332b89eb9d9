// libFuzzer target for the NCCL topology XML loader: any input either loads or fails with
// braid::Error. What loads must also print, dump, and read back from its dump to the same matrix.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>

#include "core/error.h"
#include "topology/nccl_xml.h"
#include "topology/paths.h"
#include "topology/report.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace braid::topo;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  Topology topology;
  try {
    topology = readNcclXml(text, "fuzz.xml");
  } catch (const braid::Error&) {
    return 0;
  }
  Matrix matrix = computeMatrix(topology);
  std::ostringstream out;
  printAllViews(out, topology, matrix);
  toJson(topology, matrix);
  // The dump of anything that loaded loads again, to the same classes.
  Topology again = readNcclXml(writeNcclXml(topology), "dump.xml");
  Matrix after = computeMatrix(again);
  if (after.endpoints.size() != matrix.endpoints.size()) std::abort();
  for (size_t r = 0; r < matrix.paths.size(); ++r)
    for (size_t c = 0; c < matrix.paths.size(); ++c)
      if (classLabel(matrix.paths[r][c]) != classLabel(after.paths[r][c])) std::abort();
  return 0;
}
