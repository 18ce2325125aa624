#include "kiln/distributed/store/wire.h"

#include <algorithm>
#include <string>

namespace kiln::distributed::wire {

namespace {

constexpr size_t kChunk = size_t(1) << 16;  // a field's buffer grows by at most this per read

void put_u32(Bytes& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint32_t get_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

}  // namespace

net::IoStatus read_message(const ReadExact& read, Message& m) {
  using net::IoStatus;
  uint8_t header[5];
  IoStatus s = read(header, 5);
  if (s != IoStatus::Ok) return s;
  m.tag = header[0];
  const uint32_t n = get_u32(header + 1);
  if (n > kMaxFields) return IoStatus::Closed;
  m.fields.clear();
  uint64_t total = 0;
  for (uint32_t i = 0; i < n; ++i) {
    uint8_t len[4];
    if ((s = read(len, 4)) != IoStatus::Ok) return s;
    const uint32_t size = get_u32(len);
    total += size;
    if (size > kMaxFieldBytes || total > kMaxMessageBytes) return IoStatus::Closed;
    Bytes& f = m.fields.emplace_back();
    while (f.size() < size) {
      const size_t have = f.size(), more = std::min<size_t>(size - have, std::max(kChunk, have));
      f.resize(have + more);
      if ((s = read(f.data() + have, more)) != IoStatus::Ok) return s;
    }
  }
  return IoStatus::Ok;
}

Bytes encode_message(const Message& m) {
  Bytes out;
  size_t total = 5;
  for (const Bytes& f : m.fields) total += 4 + f.size();
  out.reserve(total);
  out.push_back(m.tag);
  put_u32(out, static_cast<uint32_t>(m.fields.size()));
  for (const Bytes& f : m.fields) {
    put_u32(out, static_cast<uint32_t>(f.size()));
    out.insert(out.end(), f.begin(), f.end());
  }
  return out;
}

std::optional<std::string> oversized(const Message& m) {
  if (m.fields.size() > kMaxFields)
    return std::to_string(m.fields.size()) + " fields, over the store's limit of " + std::to_string(kMaxFields);
  uint64_t total = 0;
  for (const Bytes& f : m.fields) {
    if (f.size() > kMaxFieldBytes)
      return "a field of " + std::to_string(f.size()) + " bytes, over the store's limit of " +
             std::to_string(kMaxFieldBytes);
    total += f.size();
  }
  if (total > kMaxMessageBytes)
    return std::to_string(total) + " bytes in all, over the store's limit of " + std::to_string(kMaxMessageBytes);
  return std::nullopt;
}

Bytes encode_int(int64_t v) {
  Bytes b(8);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
  return b;
}

std::optional<int64_t> decode_int(const Bytes& b) {
  if (b.size() != 8) return std::nullopt;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[i]) << (8 * i);
  return static_cast<int64_t>(v);
}

}  // namespace kiln::distributed::wire
