#include "line_relay.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kiln_run {
namespace {

// A line longer than this is written in pieces (each one prefixed), so a rank printing without
// newlines (a progress bar drawn with '\r') cannot make kiln-run hold unbounded memory.
constexpr std::size_t kMaxLine = 64 * 1024;

}  // namespace

void write_all(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // an inherited non-blocking stdout: wait until it takes more
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
    } else {
      return;
    }
  }
}

void LineRelay::feed(const char* data, std::size_t n) {
  std::string batch;
  const char* end = data + n;
  while (data < end) {
    const char* nl = static_cast<const char*>(std::memchr(data, '\n', end - data));
    if (!nl) {
      partial_.append(data, end);
      break;
    }
    batch += prefix_;
    batch += partial_;
    batch.append(data, nl + 1);
    partial_.clear();
    data = nl + 1;
  }
  while (partial_.size() >= kMaxLine) {
    batch += prefix_;
    batch.append(partial_, 0, kMaxLine);
    batch += '\n';
    partial_.erase(0, kMaxLine);
  }
  if (!batch.empty()) write_all(out_, batch);
}

void LineRelay::finish() {
  if (partial_.empty()) return;
  write_all(out_, prefix_ + partial_ + "\n");
  partial_.clear();
}

}  // namespace kiln_run
