#include "line_relay.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
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
    const char* text_end = nl ? nl : end;
    while (data < text_end) {
      // a full piece is written only once more text follows, so a line of exactly kMaxLine
      // bytes stays one line
      if (partial_.size() == kMaxLine) {
        batch += prefix_;
        batch += partial_;
        batch += '\n';
        partial_.clear();
      }
      const std::size_t take = std::min<std::size_t>(text_end - data, kMaxLine - partial_.size());
      partial_.append(data, take);
      data += take;
    }
    if (!nl) break;
    batch += prefix_;
    batch += partial_;
    batch += '\n';
    partial_.clear();
    data = nl + 1;
  }
  if (!batch.empty()) write_all(out_, batch);
}

void LineRelay::finish() {
  if (partial_.empty()) return;
  write_all(out_, prefix_ + partial_ + "\n");
  partial_.clear();
}

}  // namespace kiln_run
