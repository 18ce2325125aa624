#pragma once
// A string's JSON escaping, for the hand-written JSON traces (the profiler's Chrome trace, the
// caching allocator's memory trace). Internal: not installed.
#include <cstdio>
#include <string>

namespace kiln::detail {

// The characters of s as they go between the quotes of a JSON string.
inline std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          o += buf;
        } else {
          o += c;
        }
    }
  }
  return o;
}

}  // namespace kiln::detail
