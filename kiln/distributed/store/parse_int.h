#pragma once
// Decimal integers read from text the distributed code does not control (internal to
// kiln/distributed): launcher environment variables and the store's counters.
#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>

namespace kiln::distributed {

// The whole of `s` as a base-10 integer; nullopt when it is empty, has anything else in it, or
// does not fit in a long long.
inline std::optional<long long> parse_int(const std::string& s) {
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

}  // namespace kiln::distributed
