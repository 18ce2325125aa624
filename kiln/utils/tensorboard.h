#pragma once
// A TensorBoard event-file writer with no protobuf dependency.
//
// SummaryWriter(dir) creates `dir` and writes `events.out.tfevents.<unix-time>.<hostname>` in
// it, the file TensorBoard's scalar dashboard reads. The format, written by hand:
//
//   * TFRecord framing, one record per Event:
//       uint64 length (little-endian) | uint32 masked_crc32c(length bytes) |
//       data[length]                  | uint32 masked_crc32c(data)
//     with masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (CRC-32C, Castagnoli).
//   * Event (tensorflow/core/util/event.proto), proto3 wire format:
//       1: double wall_time   2: int64 step   3: string file_version   5: Summary summary
//     Summary (tensorflow/core/framework/summary.proto): 1: repeated Value value
//     Value: 1: string tag   2: float simple_value
//   * The first record is {wall_time, file_version: "brain.Event:2"}; every add_scalar call
//     appends {wall_time, step, summary{value{tag, simple_value}}}.
//
// Records are buffered and written by flush(), which also runs every `flush_seconds` (default
// 10 s, so a live TensorBoard sees progress) and from the destructor. The writer is thread-safe.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace kiln::utils {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven. `crc` continues a
// previous value: crc32c(b, nb, crc32c(a, na)) == crc32c(a ++ b). crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// The TFRecord checksum: the CRC rotated right by 15 bits plus 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);

// Low-level encoders, exposed for tests and for writers of other record types.
namespace tfrecord {
// Appends one framed record holding `data` to `out`.
void append_record(std::string& out, const std::string& data);
// Protobuf wire-format pieces (append to `out`).
void put_varint(std::string& out, uint64_t v);
void put_tag(std::string& out, uint32_t field, uint32_t wire_type);
void put_double(std::string& out, uint32_t field, double v);             // wire type 1
void put_float(std::string& out, uint32_t field, float v);               // wire type 5
void put_int64(std::string& out, uint32_t field, int64_t v);             // wire type 0
void put_bytes(std::string& out, uint32_t field, const std::string& v);  // wire type 2
// Whole Event messages (the record payloads).
std::string file_version_event(double wall_time, const std::string& version = "brain.Event:2");
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& values);
}  // namespace tfrecord

class SummaryWriter {
 public:
  // Creates `dir` (and its parents) and the event file in it. `filename_suffix` is appended to
  // the file name (as PyTorch's SummaryWriter does). Throws kiln::Error naming the path on failure.
  explicit SummaryWriter(const std::string& dir, const std::string& filename_suffix = "", double flush_seconds = 10.0);
  ~SummaryWriter();  // flushes and closes
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  // One scalar point: TensorBoard plots `value` against `step` under `tag` ("train/loss").
  // wall_time < 0 means now (seconds since the Unix epoch).
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time = -1);
  // Several scalars at one step in one event (each tag its own curve).
  void add_scalars(const std::vector<std::pair<std::string, double>>& values, int64_t step, double wall_time = -1);
  void flush();  // writes the buffered records and fflush()es the file
  void close();  // flush and close; later add_* calls throw

  const std::string& path() const { return path_; }
  const std::string& log_dir() const { return dir_; }

 private:
  void write_event_locked(const std::string& event);
  void flush_locked();

  std::string dir_, path_;
  std::FILE* file_ = nullptr;
  std::string buffer_;
  double flush_seconds_;
  double last_flush_ = 0;
  std::mutex mu_;
};

// Seconds since the Unix epoch, as TensorBoard's wall_time.
double unix_time_now();

}  // namespace kiln::utils
