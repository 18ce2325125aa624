#pragma once
// Copies one output stream of a rank (read from a pipe) to kiln-run's own stdout or stderr,
// a whole line at a time, each line with the rank's prefix. kiln-run is one thread writing each
// batch of whole lines with one write, so lines of different ranks never interleave.
#include <cstddef>
#include <string>

namespace kiln_run {

class LineRelay {
 public:
  // `prefix` goes in front of every line ("" for --no-prefix); lines go to file descriptor `out`.
  LineRelay(std::string prefix, int out) : prefix_(std::move(prefix)), out_(out) {}

  // Bytes read from the rank; every complete line among them is written out now.
  void feed(const char* data, std::size_t n);

  // The stream ended: a last line without its newline is written, with a newline added.
  void finish();

 private:
  std::string prefix_;
  int out_;
  std::string partial_;  // the bytes after the last newline seen
};

// Writes all of `data` to `fd`, retrying after interrupts and short writes. A reader that went
// away (EPIPE) or another error drops the output: the ranks are more important than their log.
void write_all(int fd, const std::string& data);

}  // namespace kiln_run
