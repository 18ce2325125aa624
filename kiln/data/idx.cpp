#include "kiln/data/idx.h"

#include <cstdio>
#include <cstring>

#include "kiln/data/file_reader.h"

namespace kiln::data {

namespace {

// (bytes per element in the file, dtype of the tensor) for an IDX type code.
bool idx_type(int code, size_t* file_bytes, DType* dtype) {
  switch (code) {
    case 0x08:
      *file_bytes = 1;
      *dtype = DType::U8;
      return true;
    case 0x09:
      *file_bytes = 1;
      *dtype = DType::I32;
      return true;
    case 0x0B:
      *file_bytes = 2;
      *dtype = DType::I32;
      return true;
    case 0x0C:
      *file_bytes = 4;
      *dtype = DType::I32;
      return true;
    case 0x0D:
      *file_bytes = 4;
      *dtype = DType::F32;
      return true;
    case 0x0E:
      *file_bytes = 8;
      *dtype = DType::F64;
      return true;
    default: return false;
  }
}

// Converts the big-endian file elements in place (buffer holds n elements of file_bytes each,
// widened into `out` of the tensor's dtype).
void decode(int code, const unsigned char* in, void* out, int64_t n) {
  switch (code) {
    case 0x08: std::memcpy(out, in, static_cast<size_t>(n)); break;
    case 0x09: {
      auto* o = static_cast<int32_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<int8_t>(in[i]);
      break;
    }
    case 0x0B: {
      auto* o = static_cast<int32_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<int16_t>((in[2 * i] << 8) | in[2 * i + 1]);
      break;
    }
    case 0x0C:
    case 0x0D: {
      auto* o = static_cast<uint32_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = load_be32(in + 4 * i);
      break;
    }
    case 0x0E: {
      auto* o = static_cast<uint64_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = (uint64_t(load_be32(in + 8 * i)) << 32) | load_be32(in + 8 * i + 4);
      break;
    }
  }
}

}  // namespace

Tensor read_idx(const std::string& path) {
  FileReader r(path);
  unsigned char magic[4];
  r.read_exact(magic, 4, "read_idx (magic number)");
  size_t file_bytes = 0;
  DType dtype = DType::U8;
  KILN_CHECK(magic[0] == 0 && magic[1] == 0 && idx_type(magic[2], &file_bytes, &dtype), "read_idx: ", path,
             " is not an IDX file: bad magic number 0x", std::hex,
             (uint32_t(magic[0]) << 24 | uint32_t(magic[1]) << 16 | uint32_t(magic[2]) << 8 | magic[3]), std::dec,
             " (expected 0x000008dd for uint8 data with dd dimensions)");
  int ndim = magic[3];
  KILN_CHECK(ndim >= 1 && ndim <= 8, "read_idx: ", path, " claims ", ndim,
             " dimensions (expected 1 to 8): corrupt header");
  unsigned char dims_be[32];
  r.read_exact(dims_be, 4 * ndim, "read_idx (dimensions)");
  IntList sizes;
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    int64_t s = load_be32(dims_be + 4 * d);
    KILN_CHECK(s < (int64_t(1) << 31), "read_idx: ", path, " dimension ", d, " is ", s, ": corrupt header");
    sizes.push_back(s);
    KILN_CHECK(!__builtin_mul_overflow(n, s, &n) && n <= (int64_t(1) << 36), "read_idx: ", path, " header promises ",
               sizes, " elements: corrupt header");
  }
  size_t nbytes = static_cast<size_t>(n) * file_bytes;
  r.expect_available(nbytes, "read_idx (data)");
  Tensor out = empty(sizes, TensorOptions().dtype(dtype));
  if (magic[2] == 0x08) {
    r.read_exact(out.data_ptr(), nbytes, "read_idx (data)");
  } else {
    std::vector<unsigned char> buf(nbytes);
    r.read_exact(buf.data(), nbytes, "read_idx (data)");
    decode(magic[2], buf.data(), out.data_ptr(), n);
  }
  r.expect_end("read_idx");
  return out;
}

void write_idx(const std::string& path, const Tensor& t_in, bool gzip) {
  Tensor t = t_in.contiguous();
  int code = 0;
  switch (t.dtype()) {
    case DType::U8: code = 0x08; break;
    case DType::I32: code = 0x0C; break;
    case DType::F32: code = 0x0D; break;
    case DType::F64: code = 0x0E; break;
    default: KILN_FAIL("write_idx: dtype ", t.dtype(), " has no IDX type code");
  }
  std::string bytes;
  bytes.push_back(0);
  bytes.push_back(0);
  bytes.push_back(static_cast<char>(code));
  bytes.push_back(static_cast<char>(t.dim()));
  auto put32 = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) bytes.push_back(static_cast<char>((v >> s) & 0xff));
  };
  for (int64_t d = 0; d < t.dim(); ++d) put32(static_cast<uint32_t>(t.size(d)));
  const auto* p = static_cast<const unsigned char*>(t.data_ptr());
  size_t es = t.element_size();
  for (int64_t i = 0; i < t.numel(); ++i)
    for (size_t b = 0; b < es; ++b) bytes.push_back(static_cast<char>(p[i * es + es - 1 - b]));
  write_whole_file(path, bytes, gzip);
}

// ---------------------------------------------------------------- MNIST / Fashion-MNIST

namespace {
std::string find_idx(const std::string& root, const std::string& stem, const char* name, const char* package) {
  std::string base = root + "/" + stem;
  if (file_exists(base)) return base;
  if (file_exists(base + ".gz")) return base + ".gz";
  KILN_FAIL(name, ": ", base, "[.gz] not found. ",
            package ? std::string("Install Debian's ") + package + " package (apt install " + package + "), or pass"
                    : std::string("Pass"),
            " the folder holding the IDX files as the root argument (", name, "(root, Split::Train))");
}
}  // namespace

MNIST::MNIST(const std::string& root, Split split) { load(root, split, "MNIST", nullptr); }

MNIST::MNIST(const std::string& root, Split split, const char* name, const char* package) {
  load(root, split, name, package);
}

void MNIST::load(const std::string& root, Split split, const char* name, const char* package) {
  const char* prefix = split == Split::Train ? "train" : "t10k";
  std::string ipath = find_idx(root, std::string(prefix) + "-images-idx3-ubyte", name, package);
  std::string lpath = find_idx(root, std::string(prefix) + "-labels-idx1-ubyte", name, package);
  Tensor images = read_idx(ipath);
  Tensor labels = read_idx(lpath);
  KILN_CHECK(images.dtype() == DType::U8 && images.dim() == 3, name, ": ", ipath,
             " should hold uint8 images [N, H, W], found ", images.dtype(), " ", images.sizes());
  KILN_CHECK(labels.dtype() == DType::U8 && labels.dim() == 1, name, ": ", lpath,
             " should hold uint8 labels [N], found ", labels.dtype(), " ", labels.sizes());
  KILN_CHECK(images.size(0) == labels.size(0), name, ": ", ipath, " holds ", images.size(0), " images but ", lpath,
             " holds ", labels.size(0), " labels");
  const uint8_t* lp = labels.data_ptr<uint8_t>();
  for (int64_t i = 0; i < labels.numel(); ++i)
    KILN_CHECK(lp[i] < 10, name, ": ", lpath, " label ", i, " is ", int(lp[i]), " (expected 0..9): corrupt file");
  images_ = images.view({images.size(0), 1, images.size(1), images.size(2)});
  labels_ = labels.to(DType::I64);
}

Example MNIST::get(int64_t index) const {
  KILN_CHECK(index >= 0 && index < size(), "MNIST: index ", index, " out of range [0, ", size(), ")");
  return Example{images_.select(0, index), labels_.select(0, index)};
}

std::vector<std::string> MNIST::classes() const { return {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}; }

FashionMNIST::FashionMNIST(const std::string& root, Split split)
    : MNIST(root, split, "FashionMNIST", "dataset-fashion-mnist") {}

std::vector<std::string> FashionMNIST::classes() const {
  return {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
}

}  // namespace kiln::data
