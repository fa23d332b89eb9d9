// libFuzzer target for the NCCL topology XML loader: any input either loads or fails with
// braid::Error. What loads must also print, dump, and read back from its dump to the same matrix.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "load_and_print.h"
#include "topology/nccl_xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace braid::topo;
  auto loaded =
      loadAndPrint(std::string_view(reinterpret_cast<const char*>(data), size), readNcclXml);
  if (!loaded) return 0;
  const auto& [topology, matrix] = *loaded;
  // The dump of anything that loaded loads again, to the same classes.
  Topology again = readNcclXml(writeNcclXml(topology), "dump.xml");
  Matrix after = computeMatrix(again);
  if (after.endpoints.size() != matrix.endpoints.size()) std::abort();
  for (size_t r = 0; r < matrix.paths.size(); ++r)
    for (size_t c = 0; c < matrix.paths.size(); ++c)
      if (classLabel(matrix.paths[r][c]) != classLabel(after.paths[r][c])) std::abort();
  return 0;
}
