#pragma once
// The TCPStore's wire format (internal to kiln/distributed), apart from the sockets so that it can
// be fuzzed as bytes (docs/robustness.md).
//
// Both directions: one tag byte, a u32 field count, then each field as a u32 length and its bytes
// (integers little-endian). The reader never trusts an announced size: counts and lengths are
// checked against the limits below, and a field's buffer grows as its bytes arrive, so a peer
// that announces a gigabyte and sends ten bytes costs ten bytes.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "kiln/distributed/store/socket.h"
#include "kiln/distributed/store/store.h"

namespace kiln::distributed::wire {

// Bounds on what a peer may announce (and what a client may send).
constexpr uint32_t kMaxFields = 1u << 20;
constexpr uint64_t kMaxFieldBytes = 1u << 30;
constexpr uint64_t kMaxMessageBytes = uint64_t(1) << 30;  // the sum of a message's field lengths

struct Message {
  uint8_t tag = 0;
  std::vector<Bytes> fields;
};

// Reads exactly `size` bytes into `data`, or says why it could not.
using ReadExact = std::function<net::IoStatus(void* data, size_t size)>;

// Parses one message from `read`. Closed also stands for a malformed message (a count or length
// over the limits): either way the connection is unusable.
net::IoStatus read_message(const ReadExact& read, Message& m);

// The bytes of `m` on the wire.
Bytes encode_message(const Message& m);

// Why `m` cannot be sent (a field or the whole over the limits), or nullopt when it can.
std::optional<std::string> oversized(const Message& m);

// 8-byte little-endian integers, as the ADD/GET/WAIT fields carry them.
Bytes encode_int(int64_t v);
std::optional<int64_t> decode_int(const Bytes& b);

}  // namespace kiln::distributed::wire
