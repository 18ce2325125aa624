#pragma once
// FileReader: sequential reads from a file that may be gzip-compressed (zlib detects it from
// the magic bytes) with the checks the dataset readers need: exact reads that name the path
// and the offset when a file is short, an end-of-file check for trailing bytes, and zlib's
// CRC/length check of compressed files. Used by the IDX, CIFAR and text readers.
#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::data {

bool file_exists(const std::string& path);

class FileReader {
 public:
  // Opens `path` (raw or gzip); throws kiln::Error naming the path if it cannot.
  explicit FileReader(const std::string& path);
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  // Reads exactly n bytes; throws "<what>: <path> is truncated ..." when fewer are left, or
  // "<path> is corrupt" when decompression fails.
  void read_exact(void* dst, size_t n, const char* what);
  // Reads up to n bytes, returns how many (0 at the end).
  size_t read_some(void* dst, size_t n);
  // Throws "<what>: <path> is truncated ..." when the file cannot hold n more bytes: exact for a
  // raw file; for a gzip file, the most its size can decompress to. Readers call it before they
  // allocate what a header announces, so a forged length costs no memory.
  void expect_available(uint64_t n, const char* what) const;
  // Throws when bytes remain, then verifies the gzip trailer (CRC and length).
  void expect_end(const char* what);
  bool compressed() const { return compressed_; }
  const std::string& path() const { return path_; }
  uint64_t offset() const { return offset_; }  // uncompressed bytes read so far

 private:
  void* gz_ = nullptr;  // gzFile
  std::string path_;
  bool compressed_ = false;
  uint64_t offset_ = 0;
  uint64_t file_size_ = 0;  // on disk (compressed when gzip)
};

// Reads a whole file (raw or gzip).
std::string read_whole_file(const std::string& path);
// Writes `bytes` to `path`, gzip-compressed when `gzip`.
void write_whole_file(const std::string& path, const std::string& bytes, bool gzip = false);

// Big-endian 32-bit integer (IDX headers).
inline uint32_t load_be32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

}  // namespace kiln::data
