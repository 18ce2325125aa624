// safetensors and .npy: round trips, a file built byte by byte, and every corruption rejected
// with the path and the reason.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <unistd.h>

#include <kiln/kiln.h>
#include <kiln/nn/nn.h>

using kiln::DType;
using kiln::Tensor;
namespace nn = kiln::nn;

namespace {
std::string temp_path(const std::string& name) { return "/tmp/kiln-test-" + std::to_string(::getpid()) + "-" + name; }
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}
}  // namespace

TEST_CASE("safetensors round trip of every dtype with metadata", "[serialize]") {
  kiln::manual_seed(4);
  nn::StateDict d;
  auto base = kiln::randn({3, 5}) * 10.0;
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8, DType::Bool})
    d.insert(std::string("t_") + kiln::dtype_name(dt), base.to(dt));
  d.insert("scalar", kiln::scalar_tensor(2.5));
  d.insert("empty", kiln::empty({0, 4}));
  d.insert("strided", kiln::arange(12).view({3, 4}).t());  // saved contiguous
  std::string path = temp_path("all.safetensors");
  kiln::save(d, path, {{"format", "pt"}, {"epoch", "3"}});
  kiln::Metadata meta;
  auto back = kiln::load(path, &meta);
  REQUIRE(meta.at("epoch") == "3");
  REQUIRE(back.size() == d.size());
  for (const auto& [k, v] : d) {
    INFO(k);
    REQUIRE(back.at(k).dtype() == v.dtype());
    REQUIRE(kiln::equal(back.at(k), v));
  }
  std::remove(path.c_str());
}

TEST_CASE("a safetensors file built byte by byte loads", "[serialize]") {
  std::string header =
      R"({"b":{"dtype":"I32","shape":[2],"data_offsets":[8,16]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}})";
  std::string data;
  float fa[2] = {1.5f, -2.0f};
  int32_t ib[2] = {7, -9};
  data.append(reinterpret_cast<const char*>(fa), 8);
  data.append(reinterpret_cast<const char*>(ib), 8);
  std::string path = temp_path("manual.safetensors");
  write_bytes(path, le64(header.size()) + header + data);
  auto d = kiln::load(path);
  REQUIRE(d.at("a")[1].item<float>() == -2.0f);
  REQUIRE(d.at("b")[0].item<int32_t>() == 7);
  REQUIRE(d.at("b").dtype() == DType::I32);
  std::remove(path.c_str());
}

TEST_CASE("our files have the layout other readers expect", "[serialize]") {
  nn::StateDict d;
  d.insert("w", kiln::tensor({1.0, 2.0, 3.0}));
  std::string path = temp_path("layout.safetensors");
  kiln::save(d, path);
  std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  REQUIRE((8 + n) % 8 == 0);  // data section aligned
  REQUIRE(bytes.substr(8, n).find(R"("w":{"data_offsets":[0,12],"dtype":"F32","shape":[3]})") != std::string::npos);
  REQUIRE(bytes.size() == 8 + n + 12);
  std::remove(path.c_str());
}

TEST_CASE("corrupt and truncated safetensors files are rejected with the reason", "[serialize][errors]") {
  std::string path = temp_path("bad.safetensors");
  auto expect = [&](const std::string& bytes, const std::string& reason) {
    write_bytes(path, bytes);
    INFO(reason);
    REQUIRE_THROWS_WITH(kiln::load(path), Catch::Contains(path) && Catch::Contains(reason));
  };
  std::string good_header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string good = le64(good_header.size()) + good_header + std::string(8, '\1');
  expect("abc", "shorter than the 8-byte header length");
  expect(le64(1000) + "{}", "exceeds the file size");
  expect(le64(5) + "{nope", "not valid JSON");
  expect(good.substr(0, good.size() - 3), "lie outside");
  std::string h2 = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  expect(le64(h2.size()) + h2 + std::string(8, '\1'), "needs 12");
  std::string h3 = R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})";
  expect(le64(h3.size()) + h3 + std::string(8, '\1'), "unsupported dtype");
  std::string h4 =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  expect(le64(h4.size()) + h4 + std::string(8, '\1'), "overlaps");
  expect(good + "xx", "trailing bytes");
  std::remove(path.c_str());
  REQUIRE_THROWS_WITH(kiln::load("/nonexistent/x.safetensors"), Catch::Contains("cannot open"));
}

TEST_CASE("module save/load and strict mismatch", "[serialize]") {
  kiln::manual_seed(5);
  nn::models::FashionCNN a, b;
  std::string path = temp_path("cnn.safetensors");
  kiln::save(a, path);
  kiln::load(b, path);
  for (auto& [k, v] : a.state_dict()) {
    INFO(k);
    REQUIRE(kiln::equal(v, b.state_dict().at(k)));
  }
  nn::models::MLP mlp(784, {32}, 10);
  REQUIRE_THROWS_WITH(kiln::load(mlp, path), Catch::Contains("missing") && Catch::Contains(path));
  std::remove(path.c_str());
}

TEST_CASE("npy round trip and validation", "[serialize]") {
  std::string path = temp_path("x.npy");
  auto x = kiln::arange(24, DType::F64).reshape({2, 3, 4}) * 0.5;
  kiln::save_npy(x, path);
  std::string bytes = read_bytes(path);
  REQUIRE(bytes.substr(0, 6) == "\x93NUMPY");
  REQUIRE(bytes.find("'descr': '<f8', 'fortran_order': False, 'shape': (2, 3, 4), }") != std::string::npos);
  REQUIRE((bytes.size() - 24 * 8) % 64 == 0);
  auto y = kiln::load_npy(path);
  REQUIRE(kiln::equal(x, y));
  kiln::save_npy(kiln::tensor(std::vector<int64_t>{4}), path);
  REQUIRE(kiln::load_npy(path).sizes() == kiln::IntList{1});
  write_bytes(path, bytes.substr(0, bytes.size() - 8));
  REQUIRE_THROWS_WITH(kiln::load_npy(path), Catch::Contains("expected 192 data bytes"));
  REQUIRE_THROWS_AS(kiln::save_npy(kiln::zeros({2}, DType::BF16), path), kiln::Error);
  std::remove(path.c_str());
}

TEST_CASE("atomic writes leave no temporary behind", "[serialize]") {
  std::string path = temp_path("atomic.bin");
  kiln::write_file_atomic(path, "hello");
  REQUIRE(read_bytes(path) == "hello");
  std::ifstream tmp(path + ".tmp." + std::to_string(::getpid()));
  REQUIRE_FALSE(tmp.good());
  REQUIRE_THROWS_AS(kiln::write_file_atomic("/nonexistent-dir/x.bin", "x"), kiln::Error);
  std::remove(path.c_str());
}
