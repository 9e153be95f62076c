#pragma once
// How deeply JSON text nests, read before nlohmann's parser builds anything from it: a document
// nested deeper than its reader allows is refused unparsed (the DOM's destructor recurses).
#include <algorithm>
#include <cstddef>
#include <string_view>

namespace outlive {

// The deepest nesting of objects and arrays in `text`, from its brackets outside strings. Exact
// for JSON; for anything else the parser has the last word.
inline size_t json_nesting_depth(std::string_view text) {
  size_t depth = 0;
  size_t deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace outlive
