// Fuzz target: the TCPStore's message parser (kiln/distributed/store/wire.h), fed as bytes with no
// socket. A message that parses must encode back to the bytes it was read from.
#include <cstring>

#include "kiln/distributed/store/wire.h"
#include "tests/fuzz/fuzz_target.h"

namespace wire = kiln::distributed::wire;
using kiln::distributed::net::IoStatus;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t at = 0;
  wire::ReadExact read = [&](void* out, size_t n) {
    if (n > size - at) {
      at = size;
      return IoStatus::Closed;
    }
    std::memcpy(out, data + at, n);
    at += n;
    return IoStatus::Ok;
  };
  kiln_fuzz::expect_clean("", [&] {
    for (;;) {  // a stream of messages, as one connection sends them
      const size_t start = at;
      wire::Message m;
      if (wire::read_message(read, m) != IoStatus::Ok) break;
      const kiln::distributed::Bytes again = wire::encode_message(m);
      if (again.size() != at - start || std::memcmp(again.data(), data + start, again.size()) != 0)
        kiln_fuzz::finding("a parsed message does not encode back to its bytes");
      if (wire::oversized(m)) kiln_fuzz::finding("the parser accepted a message over the limits");
    }
  });
  return 0;
}
