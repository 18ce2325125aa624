#pragma once
// Escaping a string for the hand-written JSON and HTML outputs (the profiler's Chrome trace, the
// caching allocator's memory trace and timeline). Internal: not installed.
#include <cstdio>
#include <string>

namespace kiln::detail {

// s with every character that `escape(out, c)` appends itself (returning true) replaced by what it
// appended; the others copied as they are.
template <class Escape> std::string escape_each(const std::string& s, const Escape& escape) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    if (!escape(o, c)) o += c;
  }
  return o;
}

// The characters of s as they go between the quotes of a JSON string.
inline std::string json_escape(const std::string& s) {
  return escape_each(s, [](std::string& o, char c) {
    switch (c) {
      case '"': o += "\\\""; return true;
      case '\\': o += "\\\\"; return true;
      case '\n': o += "\\n"; return true;
      case '\t': o += "\\t"; return true;
      default: break;
    }
    if (static_cast<unsigned char>(c) >= 0x20) return false;
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
    o += buf;
    return true;
  });
}

// The characters of s as they go into HTML text or a quoted attribute.
inline std::string html_escape(const std::string& s) {
  return escape_each(s, [](std::string& o, char c) {
    const char* r = c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : c == '"' ? "&quot;" : nullptr;
    if (r) o += r;
    return r != nullptr;
  });
}

}  // namespace kiln::detail
