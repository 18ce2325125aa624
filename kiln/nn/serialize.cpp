#include "kiln/nn/serialize.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/core/autograd.h"

namespace kiln {

namespace {

using json = nlohmann::json;

const char* st_dtype(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
    case DType::Bool: return "BOOL";
  }
  return "?";
}

bool parse_st_dtype(const std::string& s, DType& out) {
  static const std::pair<const char*, DType> table[] = {
      {"F32", DType::F32}, {"F64", DType::F64}, {"F16", DType::F16}, {"BF16", DType::BF16},
      {"I64", DType::I64}, {"I32", DType::I32}, {"U8", DType::U8},   {"BOOL", DType::Bool}};
  for (auto& [name, d] : table)
    if (s == name) {
      out = d;
      return true;
    }
  return false;
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  KILN_CHECK(f.good(), what, ": cannot open '", path, "': ", std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Tensor host_contiguous(const Tensor& t) {
  NoGradGuard ng;
  return t.detach().to(Device::cpu()).contiguous();
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  KILN_CHECK(fd >= 0, "save: cannot create '", tmp, "': ", std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      KILN_FAIL("save: writing '", tmp, "' failed: ", std::strerror(e));
    }
    done += static_cast<size_t>(n);
  }
  bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced || std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    KILN_FAIL("save: could not finish writing '", path, "': ", std::strerror(e));
  }
  // Make the rename itself durable.
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  if (dir.empty()) dir = "/";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

// ---------------------------------------------------------------- safetensors

void save(const nn::StateDict& tensors, const std::string& path, const Metadata& metadata) {
  json header = json::object();
  std::vector<Tensor> host;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    KILN_CHECK(t.defined(), "save: tensor '", name, "' is undefined");
    KILN_CHECK(name != "__metadata__", "save: '__metadata__' is reserved");
    Tensor h = host_contiguous(t);
    size_t n = h.nbytes();
    header[name] = {{"dtype", st_dtype(h.dtype())}, {"shape", h.sizes()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
    host.push_back(h);
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string hs = header.dump();
  while ((8 + hs.size()) % 8 != 0) hs.push_back(' ');  // align the data section to 8 bytes
  std::string bytes(8, '\0');
  uint64_t n = hs.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  bytes += hs;
  bytes.reserve(bytes.size() + offset);
  for (const Tensor& h : host) bytes.append(static_cast<const char*>(h.data_ptr()), h.nbytes());
  write_file_atomic(path, bytes);
}

void save(const nn::Module& module, const std::string& path, const Metadata& metadata) {
  save(module.state_dict(), path, metadata);
}

nn::StateDict load(const std::string& path, Metadata* metadata) {
  std::string bytes = read_file(path, "load");
  KILN_CHECK(bytes.size() >= 8, "load: '", path, "' is not a safetensors file: ", bytes.size(),
             " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  KILN_CHECK(n <= bytes.size() - 8, "load: '", path, "': header length ", n, " exceeds the file size ", bytes.size(),
             " (truncated or not a safetensors file)");
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const json::exception& e) {
    KILN_FAIL("load: '", path, "': the header is not valid JSON: ", e.what());
  }
  KILN_CHECK(header.is_object(), "load: '", path, "': the header is not a JSON object");
  const size_t data_begin = 8 + n, data_size = bytes.size() - data_begin;
  struct Entry {
    std::string name;
    DType dtype;
    IntList shape;
    size_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      KILN_CHECK(it.value().is_object(), "load: '", path, "': __metadata__ must be an object");
      if (metadata) {
        for (auto m = it.value().begin(); m != it.value().end(); ++m) {
          KILN_CHECK(m.value().is_string(), "load: '", path, "': __metadata__ values must be strings");
          (*metadata)[m.key()] = m.value().get<std::string>();
        }
      }
      continue;
    }
    const json& v = it.value();
    Entry e;
    e.name = it.key();
    KILN_CHECK(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"), "load: '",
               path, "': entry '", e.name, "' needs dtype, shape and data_offsets");
    KILN_CHECK(v["dtype"].is_string() && parse_st_dtype(v["dtype"].get<std::string>(), e.dtype), "load: '", path,
               "': entry '", e.name, "' has unsupported dtype ", v["dtype"].dump());
    KILN_CHECK(v["shape"].is_array(), "load: '", path, "': entry '", e.name, "' has a bad shape");
    uint64_t nbytes = element_size(e.dtype);
    for (const auto& d : v["shape"]) {
      KILN_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= uint64_t(INT64_MAX), "load: '", path, "': entry '",
                 e.name, "' has a bad shape ", v["shape"].dump());
      e.shape.push_back(d.get<int64_t>());
      KILN_CHECK(!__builtin_mul_overflow(nbytes, d.get<uint64_t>(), &nbytes), "load: '", path, "': entry '", e.name,
                 "' has a shape ", v["shape"].dump(), " whose size overflows");
    }
    const json& off = v["data_offsets"];
    KILN_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
               "load: '", path, "': entry '", e.name, "' has bad data_offsets");
    e.begin = off[0].get<size_t>();
    e.end = off[1].get<size_t>();
    KILN_CHECK(e.begin <= e.end && e.end <= data_size, "load: '", path, "': entry '", e.name, "' data_offsets [",
               e.begin, ", ", e.end, "] lie outside the ", data_size, "-byte data section (truncated file?)");
    KILN_CHECK(e.end - e.begin == nbytes, "load: '", path, "': entry '", e.name, "' has ", e.end - e.begin,
               " bytes but shape ", e.shape, " of ", dtype_name(e.dtype), " needs ", nbytes);
    entries.push_back(std::move(e));
  }
  // The byte buffer must be covered exactly, without overlaps or holes (as the format requires).
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const auto& e : entries) ranges.emplace_back(e.begin, e.end);
  std::sort(ranges.begin(), ranges.end());
  size_t covered = 0;
  for (auto& [b, en] : ranges) {
    KILN_CHECK(b == covered, "load: '", path, "': tensor data ", (b < covered ? "overlaps" : "has a hole"), " at byte ",
               std::min(b, covered));
    covered = en;
  }
  KILN_CHECK(covered == data_size, "load: '", path, "': ", data_size - covered,
             " trailing bytes after the last tensor");
  // Keep the header's order (nlohmann sorts keys; safetensors files are sorted too).
  nn::StateDict out;
  for (const auto& e : entries) {
    Tensor t = empty(e.shape, e.dtype);
    if (e.end > e.begin) std::memcpy(t.data_ptr(), bytes.data() + data_begin + e.begin, e.end - e.begin);
    out.insert(e.name, t);
  }
  return out;
}

void load(nn::Module& module, const std::string& path, bool strict) {
  try {
    module.load_state_dict(load(path), strict);
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.find(path) == std::string::npos) KILN_FAIL("load: '", path, "': ", msg);
    throw;
  }
}

// ---------------------------------------------------------------- .npy

namespace {
const char* npy_descr(DType d) {
  switch (d) {
    case DType::F32: return "<f4";
    case DType::F64: return "<f8";
    case DType::F16: return "<f2";
    case DType::I64: return "<i8";
    case DType::I32: return "<i4";
    case DType::U8: return "|u1";
    case DType::Bool: return "|b1";
    default: return nullptr;
  }
}
}  // namespace

void save_npy(const Tensor& tensor, const std::string& path) {
  const char* descr = npy_descr(tensor.dtype());
  KILN_CHECK(descr, "save_npy: dtype ", tensor.dtype(), " has no NumPy equivalent");
  Tensor h = host_contiguous(tensor);
  std::string shape = "(";
  for (int64_t s : h.sizes()) shape += std::to_string(s) + ", ";
  if (h.dim() > 1) shape.erase(shape.size() - 2);
  else if (h.dim() == 1) shape.erase(shape.size() - 1);
  shape += ")";
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict.push_back('\n');
  std::string bytes = "\x93NUMPY";
  bytes.push_back(1);
  bytes.push_back(0);
  uint16_t hl = static_cast<uint16_t>(dict.size());
  bytes.push_back(static_cast<char>(hl & 0xff));
  bytes.push_back(static_cast<char>(hl >> 8));
  bytes += dict;
  bytes.append(static_cast<const char*>(h.data_ptr()), h.nbytes());
  write_file_atomic(path, bytes);
}

namespace {

// The header of a .npy file: a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// read strictly: every error names the file, the byte offset in the file and what was expected.
struct NpyHeader {
  DType dtype = DType::F32;
  IntList shape;
};

class NpyHeaderParser {
 public:
  NpyHeaderParser(const std::string& path, const std::string& text, size_t file_offset)
      : path_(path), h_(text), base_(file_offset) {}

  NpyHeader parse() {
    NpyHeader out;
    bool descr = false, order = false, shape = false;
    expect('{', "'{' opening the header dict");
    while (skip_space(), peek() != '}') {
      std::string key = quoted("a quoted key");
      expect(':', "':' after key '" + key + "'");
      if (key == "descr") {
        out.dtype = dtype(quoted("a quoted dtype such as '<f4'"));
        descr = true;
      } else if (key == "fortran_order") {
        KILN_CHECK(!word("True"), "load_npy: '", path_, "': Fortran order is not supported");
        KILN_CHECK(word("False"), "load_npy: '", path_, "': byte ", where(), ": expected True or False for ",
                   "'fortran_order'");
        order = true;
      } else if (key == "shape") {
        out.shape = tuple();
        shape = true;
      } else {
        fail("one of the keys 'descr', 'fortran_order', 'shape', found '" + key + "'");
      }
      skip_space();
      if (peek() == ',') ++i_;
      else
        KILN_CHECK(peek() == '}', "load_npy: '", path_, "': byte ", where(), ": expected ',' or '}' after '", key, "'");
    }
    KILN_CHECK(descr && order && shape, "load_npy: '", path_, "': the header lacks '",
               !descr   ? "descr"
               : !order ? "fortran_order"
                        : "shape",
               "'");
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& expected) const {
    KILN_FAIL("load_npy: '", path_, "': byte ", where(), " of the header: expected ", expected);
  }
  size_t where() const { return base_ + i_; }
  char peek() const { return i_ < h_.size() ? h_[i_] : '\0'; }
  void skip_space() {
    while (i_ < h_.size() && (h_[i_] == ' ' || h_[i_] == '\n')) ++i_;
  }
  void expect(char c, const std::string& what) {
    skip_space();
    if (peek() != c) fail(what);
    ++i_;
  }
  bool word(const char* w) {
    skip_space();
    const size_t n = std::strlen(w);
    if (h_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }
  std::string quoted(const std::string& what) {
    skip_space();
    const char q = peek();
    if (q != '\'' && q != '"') fail(what);
    const size_t close = h_.find(q, i_ + 1);
    if (close == std::string::npos) fail(what + " with its closing quote");
    std::string out = h_.substr(i_ + 1, close - i_ - 1);
    i_ = close + 1;
    return out;
  }
  DType dtype(const std::string& descr) const {
    for (DType d : {DType::F32, DType::F64, DType::F16, DType::I64, DType::I32, DType::U8, DType::Bool})
      if (descr == npy_descr(d)) return d;
    KILN_FAIL("load_npy: '", path_, "': unsupported dtype '", descr, "'");
  }
  // (d0, d1, ...) of non-negative decimal integers, with an optional trailing comma.
  IntList tuple() {
    expect('(', "'(' opening the shape");
    IntList out;
    for (;;) {
      skip_space();
      if (peek() == ')') break;
      if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("a non-negative integer in the shape");
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        KILN_CHECK(v <= (INT64_MAX - 9) / 10, "load_npy: '", path_, "': byte ", where(),
                   ": a dimension of the shape is too large");
        v = v * 10 + (h_[i_++] - '0');
      }
      if (peek() == 'L') ++i_;  // Python 2 wrote longs with a suffix
      out.push_back(v);
      skip_space();
      if (peek() == ',') ++i_;
      else if (peek() != ')') fail("',' or ')' in the shape");
    }
    ++i_;
    return out;
  }

  const std::string& path_;
  const std::string& h_;
  size_t base_, i_ = 0;
};

}  // namespace

Tensor load_npy(const std::string& path) {
  std::string b = read_file(path, "load_npy");
  KILN_CHECK(b.size() >= 10 && b.compare(0, 6, "\x93NUMPY") == 0, "load_npy: '", path, "' is not a .npy file");
  const int major = static_cast<uint8_t>(b[6]);
  size_t hl, hstart;
  if (major == 1) {
    hl = static_cast<uint8_t>(b[8]) | (static_cast<size_t>(static_cast<uint8_t>(b[9])) << 8);
    hstart = 10;
  } else {
    KILN_CHECK(major == 2 || major == 3, "load_npy: '", path, "': unsupported version ", major);
    KILN_CHECK(b.size() >= 12, "load_npy: '", path, "': truncated header");
    hl = 0;
    for (int i = 0; i < 4; ++i) hl |= static_cast<size_t>(static_cast<uint8_t>(b[8 + i])) << (8 * i);
    hstart = 12;
  }
  KILN_CHECK(hl <= b.size() - hstart, "load_npy: '", path, "': the header claims ", hl, " bytes but the file holds ",
             b.size() - hstart, " after the preamble (truncated header)");
  const std::string text = b.substr(hstart, hl);
  NpyHeader header = NpyHeaderParser(path, text, hstart).parse();
  // The data size is checked against the file before anything is allocated.
  uint64_t need = element_size(header.dtype);
  for (int64_t s : header.shape)
    KILN_CHECK(!__builtin_mul_overflow(need, static_cast<uint64_t>(s), &need), "load_npy: '", path, "': shape ",
               header.shape, " overflows");
  const size_t have = b.size() - hstart - hl;
  KILN_CHECK(have == need, "load_npy: '", path, "': expected ", need, " data bytes for shape ", header.shape,
             ", found ", have);
  Tensor t = empty(header.shape, header.dtype);
  if (need) std::memcpy(t.data_ptr(), b.data() + hstart + hl, need);
  return t;
}

}  // namespace kiln
