#pragma once
// kiln::Error and KILN_CHECK: every bad input becomes an exception that names the op and the
// shapes/dtypes/devices involved (docs/architecture.md, "Errors"). Messages are built by streaming the arguments.
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln {

class Error : public std::runtime_error {
 public:
  Error(const std::string& msg, const char* file, int line) : std::runtime_error(msg), file_(file), line_(line) {}
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  const char* file_ = "";
  int line_ = 0;
};

// Memory ran out: a device's (or the CPU allocator's, under set_cpu_memory_limit) memory could
// not hold an allocation, even after the allocator gave its cache back. A kiln::Error, so code that
// catches errors catches it; code that can recover (kiln-train writes a checkpoint) catches it by
// type, as torch.cuda.OutOfMemoryError.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class T> void stream_one(std::ostream& os, const T& v) { os << v; }
template <class T> void stream_one(std::ostream& os, const std::vector<T>& v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
}
template <class... Args> std::string concat(const Args&... args) {
  std::ostringstream os;
  (stream_one(os, args), ...);
  return os.str();
}
}  // namespace detail

}  // namespace kiln

#define KILN_CHECK(cond, ...)                                                                  \
  do {                                                                                         \
    if (!(cond)) throw ::kiln::Error(::kiln::detail::concat(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)

#define KILN_FAIL(...) throw ::kiln::Error(::kiln::detail::concat(__VA_ARGS__), __FILE__, __LINE__)
#define KILN_FAIL_OUT_OF_MEMORY(...) \
  throw ::kiln::OutOfMemoryError(::kiln::detail::concat(__VA_ARGS__), __FILE__, __LINE__)
