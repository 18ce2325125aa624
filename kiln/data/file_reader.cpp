#include "kiln/data/file_reader.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "kiln/core/error.h"

namespace kiln::data {

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

namespace {
gzFile G(void* p) { return static_cast<gzFile>(p); }

std::string gz_error(void* gz) {
  int code = 0;
  const char* msg = gzerror(G(gz), &code);
  if (code == Z_ERRNO) return std::strerror(errno);
  return msg ? msg : "unknown zlib error";
}
}  // namespace

FileReader::FileReader(const std::string& path) : path_(path) {
  struct stat st;
  KILN_CHECK(::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode), path, ": no such file");
  file_size_ = static_cast<uint64_t>(st.st_size);
  gzFile f = gzopen(path.c_str(), "rb");
  KILN_CHECK(f != nullptr, path, ": cannot open: ", std::strerror(errno));
  gzbuffer(f, 1 << 17);
  gz_ = f;
  // gzdirect is only meaningful after the first read fills the buffer; peek one byte.
  int c = gzgetc(f);
  if (c != -1) gzungetc(c, f);
  compressed_ = gzdirect(f) == 0;
}

FileReader::~FileReader() {
  if (gz_) gzclose_r(G(gz_));
}

size_t FileReader::read_some(void* dst, size_t n) {
  size_t total = 0;
  auto* out = static_cast<unsigned char*>(dst);
  while (total < n) {
    unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - total, 1u << 30));
    int got = gzread(G(gz_), out + total, chunk);
    if (got < 0)
      KILN_FAIL(path_, " is corrupt (", compressed_ ? "gzip" : "read", " error at byte ", offset_ + total,
                "): ", gz_error(gz_));
    if (got == 0) {
      int code = 0;
      gzerror(G(gz_), &code);
      if (code != Z_OK && code != Z_BUF_ERROR)
        KILN_FAIL(path_, " is corrupt (error at byte ", offset_ + total, "): ", gz_error(gz_));
      break;
    }
    total += static_cast<size_t>(got);
  }
  offset_ += total;
  return total;
}

void FileReader::read_exact(void* dst, size_t n, const char* what) {
  uint64_t start = offset_;
  size_t got = read_some(dst, n);
  if (got != n) {
    int code = 0;
    gzerror(G(gz_), &code);
    KILN_FAIL(what, ": ", path_, " is truncated: needed ", n, " bytes at offset ", start, ", found ", got,
              compressed_ && code == Z_BUF_ERROR ? " (gzip stream ends early)" : "");
  }
}

void FileReader::expect_available(uint64_t n, const char* what) const {
  // Deflate expands at most 1032:1; the constant covers the gzip header and trailer.
  const uint64_t room = compressed_ ? file_size_ * 1032 + 1024 : file_size_ - std::min(offset_, file_size_);
  KILN_CHECK(n <= room, what, ": ", path_, " is truncated: the header announces ", n, " bytes at offset ", offset_,
             " but the file ", compressed_ ? "cannot decompress to more than " : "holds only ", room);
}

void FileReader::expect_end(const char* what) {
  unsigned char extra[64];
  size_t got = read_some(extra, sizeof extra);
  if (got != 0) {
    uint64_t more = offset_;
    while (read_some(extra, sizeof extra) > 0) {
    }
    KILN_FAIL(what, ": ", path_, " has ", offset_ - more + got, " unexpected trailing bytes after ", more - got,
              " bytes (wrong count in the header, or a corrupt file)");
  }
  int code = 0;
  gzerror(G(gz_), &code);
  KILN_CHECK(code == Z_OK, what, ": ", path_, " is corrupt: ", gz_error(gz_));
  int rc = gzclose_r(G(gz_));
  gz_ = nullptr;
  KILN_CHECK(rc == Z_OK, what, ": ", path_, " is corrupt (gzip stream ends early or fails its ", "checksum, zlib code ",
             rc, ")");
}

std::string read_whole_file(const std::string& path) {
  FileReader r(path);
  std::string out;
  char buf[1 << 16];
  size_t got;
  while ((got = r.read_some(buf, sizeof buf)) > 0) out.append(buf, got);
  r.expect_end("read_whole_file");
  return out;
}

void write_whole_file(const std::string& path, const std::string& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    KILN_CHECK(f != nullptr, "write_whole_file: cannot create ", path);
    size_t done = 0;
    bool ok = true;
    while (ok && done < bytes.size()) {
      unsigned chunk = static_cast<unsigned>(std::min<size_t>(bytes.size() - done, 1u << 30));
      ok = gzwrite(f, bytes.data() + done, chunk) == static_cast<int>(chunk);
      done += chunk;
    }
    int rc = gzclose(f);
    KILN_CHECK(ok && rc == Z_OK, "write_whole_file: writing ", path, " failed");
  } else {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    KILN_CHECK(f != nullptr, "write_whole_file: cannot create ", path, ": ", std::strerror(errno));
    size_t w = std::fwrite(bytes.data(), 1, bytes.size(), f);
    int rc = std::fclose(f);
    KILN_CHECK(w == bytes.size() && rc == 0, "write_whole_file: writing ", path, " failed");
  }
}

}  // namespace kiln::data
