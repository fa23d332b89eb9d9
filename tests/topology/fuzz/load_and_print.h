// What both fuzz targets do first: any input either loads or fails with braid::Error; what loads
// must print in every view and as JSON.
#pragma once

#include <optional>
#include <sstream>
#include <string_view>
#include <utility>

#include "base/error.h"
#include "topology/paths.h"
#include "topology/report.h"

namespace braid::topo {

// The topology `read` makes of `text` and its matrix, printed; nullopt when `read` rejects it.
template <typename Read>
std::optional<std::pair<Topology, Matrix>> loadAndPrint(std::string_view text, Read read) {
  Topology topology;
  try {
    topology = read(text, "fuzz.xml");
  } catch (const braid::Error&) {
    return std::nullopt;
  }
  Matrix matrix = computeMatrix(topology);
  std::ostringstream out;
  printAllViews(out, topology, matrix);
  toJson(topology, matrix);
  return std::make_pair(std::move(topology), std::move(matrix));
}

}  // namespace braid::topo
