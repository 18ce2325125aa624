#include "kiln/utils/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "kiln/core/error.h"

namespace kiln::utils {

namespace {

std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : (c >> 1);
    t[i] = c;
  }
  return t;
}

const std::array<uint32_t, 256>& crc32c_table() {
  static const std::array<uint32_t, 256> table = make_crc32c_table();
  return table;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto& t = crc32c_table();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = t[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

double unix_time_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

namespace tfrecord {

void append_record(std::string& out, const std::string& data) {
  std::string len;
  put_le(len, data.size(), 8);
  out += len;
  put_le(out, masked_crc32c(len.data(), len.size()), 4);
  out += data;
  put_le(out, masked_crc32c(data.data(), data.size()), 4);
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_tag(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_tag(out, field, 1);
  put_le(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_tag(out, field, 5);
  put_le(out, bits, 4);
}

void put_int64(std::string& out, uint32_t field, int64_t v) {
  put_tag(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));  // negative values take 10 bytes, as in protobuf
}

void put_bytes(std::string& out, uint32_t field, const std::string& v) {
  put_tag(out, field, 2);
  put_varint(out, v.size());
  out += v;
}

std::string file_version_event(double wall_time, const std::string& version) {
  std::string ev;
  put_double(ev, 1, wall_time);
  put_bytes(ev, 3, version);
  return ev;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    put_bytes(value, 1, tag);
    put_float(value, 2, v);
    put_bytes(summary, 1, value);
  }
  std::string ev;
  put_double(ev, 1, wall_time);
  put_int64(ev, 2, step);
  put_bytes(ev, 5, summary);
  return ev;
}

}  // namespace tfrecord

SummaryWriter::SummaryWriter(const std::string& dir, const std::string& filename_suffix, double flush_seconds)
    : dir_(dir), flush_seconds_(flush_seconds) {
  namespace fs = std::filesystem;
  KILN_CHECK(!dir.empty(), "SummaryWriter: empty log directory");
  std::error_code ec;
  fs::create_directories(dir, ec);
  KILN_CHECK(fs::is_directory(dir), "SummaryWriter: cannot create log directory '", dir,
             "': ", ec ? ec.message() : std::string("not a directory"));
  const double now = unix_time_now();
  const std::string base =
      (fs::path(dir) / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + hostname()))
          .string();
  // Two writers opened in the same second in the same folder get distinct files.
  path_ = base + filename_suffix;
  for (int i = 1; fs::exists(path_); ++i) path_ = base + "." + std::to_string(i) + filename_suffix;
  file_ = std::fopen(path_.c_str(), "wb");
  KILN_CHECK(file_ != nullptr, "SummaryWriter: cannot open '", path_, "' for writing: ", std::strerror(errno));
  std::lock_guard<std::mutex> lock(mu_);
  tfrecord::append_record(buffer_, tfrecord::file_version_event(now));
  flush_locked();
}

SummaryWriter::~SummaryWriter() {
  try {
    close();
  } catch (...) {
    // destructors must not throw; a failed final write is lost
  }
}

void SummaryWriter::add_scalar(const std::string& tag, double value, int64_t step, double wall_time) {
  add_scalars({{tag, value}}, step, wall_time);
}

void SummaryWriter::add_scalars(const std::vector<std::pair<std::string, double>>& values, int64_t step,
                                double wall_time) {
  std::vector<std::pair<std::string, float>> fv;
  fv.reserve(values.size());
  for (const auto& [tag, v] : values) {
    KILN_CHECK(!tag.empty(), "SummaryWriter::add_scalar: empty tag (file ", path_, ")");
    fv.emplace_back(tag, static_cast<float>(v));
  }
  const double wt = wall_time < 0 ? unix_time_now() : wall_time;
  std::lock_guard<std::mutex> lock(mu_);
  write_event_locked(tfrecord::scalars_event(wt, step, fv));
}

void SummaryWriter::write_event_locked(const std::string& event) {
  KILN_CHECK(file_ != nullptr, "SummaryWriter: write after close (file ", path_, ")");
  tfrecord::append_record(buffer_, event);
  if (unix_time_now() - last_flush_ >= flush_seconds_) flush_locked();
}

void SummaryWriter::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  flush_locked();
}

void SummaryWriter::flush_locked() {
  last_flush_ = unix_time_now();
  if (file_ == nullptr) return;
  if (!buffer_.empty()) {
    const size_t n = std::fwrite(buffer_.data(), 1, buffer_.size(), file_);
    const bool ok = n == buffer_.size();
    buffer_.clear();
    KILN_CHECK(ok, "SummaryWriter: short write to '", path_, "': ", std::strerror(errno));
  }
  KILN_CHECK(std::fflush(file_) == 0, "SummaryWriter: cannot flush '", path_, "': ", std::strerror(errno));
}

void SummaryWriter::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  std::string err;
  try {
    flush_locked();
  } catch (const std::exception& e) {
    err = e.what();
  }
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  KILN_CHECK(err.empty(), err);
  KILN_CHECK(closed, "SummaryWriter: cannot close '", path_, "'");
}

}  // namespace kiln::utils
