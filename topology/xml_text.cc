#include "topology/xml_text.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "base/error.h"

namespace braid::topo {
namespace {

struct OpenTag {
  std::string name;
  size_t offset;
};

// A light pass over the markup, independent of pugixml: the elements still open at the end of the
// text (what a truncated file lacks) and the first tab outside comments and quoted values (NCCL's
// parser does not skip tabs).
struct MarkupScan {
  std::vector<OpenTag> open;
  size_t firstTab = std::string::npos;
};

MarkupScan scanMarkup(const std::string& text) {
  MarkupScan scan;
  const size_t n = text.size();
  size_t i = 0;
  auto skipPast = [&](const char* end) {
    size_t found = text.find(end, i);
    i = found == std::string::npos ? n : found + std::strlen(end);
  };
  while (i < n) {
    char c = text[i];
    if (c == '\t' && scan.firstTab == std::string::npos) scan.firstTab = i;
    if (c != '<') {
      ++i;
      continue;
    }
    if (text.compare(i, 4, "<!--") == 0) {
      i += 4;
      skipPast("-->");
      continue;
    }
    if (text.compare(i, 2, "<?") == 0) {
      skipPast("?>");
      continue;
    }
    if (text.compare(i, 2, "<!") == 0) {
      skipPast(">");
      continue;
    }
    bool closing = i + 1 < n && text[i + 1] == '/';
    size_t nameStart = i + (closing ? 2 : 1), j = nameStart;
    while (j < n && !std::isspace(static_cast<unsigned char>(text[j])) && text[j] != '>' &&
           text[j] != '/')
      ++j;
    std::string name = text.substr(nameStart, j - nameStart);
    char quote = 0;
    bool selfClosing = false;
    for (; j < n; ++j) {
      char d = text[j];
      if (quote) {
        if (d == quote) quote = 0;
      } else if (d == '"' || d == '\'') {
        quote = d;
      } else if (d == '\t' && scan.firstTab == std::string::npos) {
        scan.firstTab = j;
      } else if (d == '>') {
        selfClosing = text[j - 1] == '/';
        break;
      }
    }
    i = j < n ? j + 1 : n;
    if (closing) {
      auto match = std::find_if(scan.open.rbegin(), scan.open.rend(),
                                [&](const OpenTag& tag) { return tag.name == name; });
      if (match != scan.open.rend()) scan.open.erase(std::next(match).base(), scan.open.end());
    } else if (!selfClosing) {
      scan.open.push_back({name, nameStart});
    }
  }
  return scan;
}

}  // namespace

XmlText::XmlText(std::string_view text, std::string origin)
    : text_(text), origin_(std::move(origin)) {
  lineStarts_.push_back(0);
  for (size_t i = 0; i < text_.size(); ++i)
    if (text_[i] == '\n') lineStarts_.push_back(i + 1);
  pugi::xml_parse_result result =
      doc_.load_buffer(text_.data(), text_.size(), pugi::parse_default, pugi::encoding_utf8);
  if (result) return;
  auto [line, column] = position(static_cast<size_t>(std::max<ptrdiff_t>(result.offset, 0)));
  if (result.status == pugi::status_no_document_element)
    fail(braidInvalidArgument, "{}:{}:{}: no XML element; expected a root element", origin_, line,
         column);
  MarkupScan scan = scanMarkup(text_);
  if (!scan.open.empty() && static_cast<size_t>(result.offset) + 1 >= text_.size()) {
    const OpenTag& tag = scan.open.back();
    fail(braidInvalidArgument, "{}:{}:{}: the file ends inside <{}> from line {}; expected </{}>",
         origin_, line, column, tag.name, position(tag.offset).first, tag.name);
  }
  fail(braidInvalidArgument, "{}:{}:{}: not well-formed XML ({}); expected well-formed XML",
       origin_, line, column, result.description());
}

std::pair<int, int> XmlText::position(size_t offset) const {
  auto it = std::upper_bound(lineStarts_.begin(), lineStarts_.end(), offset);
  size_t line = static_cast<size_t>(it - lineStarts_.begin());
  return {static_cast<int>(line), static_cast<int>(offset - lineStarts_[line - 1] + 1)};
}

int XmlText::lineOf(pugi::xml_node node) const {
  ptrdiff_t offset = node.offset_debug();
  return offset < 0 ? 0 : position(static_cast<size_t>(offset)).first;
}

std::string XmlText::where(pugi::xml_node node) const {
  return fmt::format("{}:{}", origin_, lineOf(node));
}

std::pair<int, int> XmlText::firstTabBetweenTokens() const {
  size_t tab = scanMarkup(text_).firstTab;
  return tab == std::string::npos ? std::pair<int, int>{0, 0} : position(tab);
}

}  // namespace braid::topo
