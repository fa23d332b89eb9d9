// libFuzzer target for the hwloc XML loader (pugixml's check, then hwloc's own import): any input
// either loads or fails with braid::Error; what loads must also print and dump as NCCL XML.
#include <cstddef>
#include <cstdint>

#include "load_and_print.h"
#include "topology/hwloc_import.h"
#include "topology/nccl_xml.h"

// hwloc 2.9's XML importer leaks the objects it built when it gives up on a file ("invalid special
// object child", ...): a leak inside libhwloc, not in braid, which destroys every topology it made.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libhwloc.so\n";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace braid::topo;
  auto loaded =
      loadAndPrint(std::string_view(reinterpret_cast<const char*>(data), size), readHwlocXml);
  if (loaded) readNcclXml(writeNcclXml(loaded->first), "dump.xml");
  return 0;
}
