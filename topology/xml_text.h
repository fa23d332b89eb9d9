// An XML file parsed with pugixml, kept with its text so that every error can name the file, the
// line and what was expected. Shared by the NCCL and hwloc loaders.
#pragma once

#include <pugixml.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace braid::topo {

class XmlText {
 public:
  // Parses `text`; a syntax error throws braid::Error naming `origin`, the line and column, and the
  // closing tag that was expected where the file ends early.
  XmlText(std::string_view text, std::string origin);

  const pugi::xml_document& doc() const { return doc_; }
  pugi::xml_node root() const { return doc_.document_element(); }
  const std::string& origin() const { return origin_; }
  int lineOf(pugi::xml_node node) const;
  // "file:line" for messages about `node`.
  std::string where(pugi::xml_node node) const;
  // Line and column of the first tab outside comments and quoted values; line 0 when none.
  std::pair<int, int> firstTabBetweenTokens() const;

 private:
  std::pair<int, int> position(size_t offset) const;

  std::string text_;
  std::string origin_;
  std::vector<size_t> lineStarts_;
  pugi::xml_document doc_;
};

}  // namespace braid::topo
