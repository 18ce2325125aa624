// SummaryWriter: the event file is read back record by record (both CRCs checked) and its
// protobuf fields decoded by a small wire-format reader written here, independent of the writer.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/utils/tensorboard.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace kiln::utils;

namespace {

uint64_t le(const std::string& s, size_t off, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(uint8_t(s[off + i])) << (8 * i);
  return v;
}

// ---- a minimal protobuf wire-format decoder
struct Field {
  uint32_t number = 0, wire = 0;
  uint64_t num = 0;   // varint, fixed64 or fixed32 payload
  std::string bytes;  // length-delimited payload
};

uint64_t read_varint(const std::string& s, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    REQUIRE(pos < s.size());
    const uint8_t b = uint8_t(s[pos++]);
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  FAIL("varint longer than 10 bytes");
  return 0;
}

std::vector<Field> decode(const std::string& msg) {
  std::vector<Field> out;
  size_t pos = 0;
  while (pos < msg.size()) {
    Field f;
    const uint64_t key = read_varint(msg, pos);
    f.number = uint32_t(key >> 3), f.wire = uint32_t(key & 7);
    switch (f.wire) {
      case 0: f.num = read_varint(msg, pos); break;
      case 1:
        REQUIRE(pos + 8 <= msg.size());
        f.num = le(msg, pos, 8);
        pos += 8;
        break;
      case 5:
        REQUIRE(pos + 4 <= msg.size());
        f.num = le(msg, pos, 4);
        pos += 4;
        break;
      case 2: {
        const uint64_t n = read_varint(msg, pos);
        REQUIRE(pos + n <= msg.size());
        f.bytes = msg.substr(pos, n);
        pos += n;
        break;
      }
      default: FAIL("unexpected wire type " << f.wire);
    }
    out.push_back(f);
  }
  return out;
}

double as_double(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}
float as_float(uint64_t bits) {
  uint32_t b = uint32_t(bits);
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// Splits a TFRecord file into its payloads, checking the framing and both checksums.
std::vector<std::string> read_records(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  std::vector<std::string> recs;
  size_t pos = 0;
  while (pos < s.size()) {
    REQUIRE(pos + 12 <= s.size());
    const uint64_t len = le(s, pos, 8);
    CHECK(uint32_t(le(s, pos + 8, 4)) == mask(crc32c(s.data() + pos, 8)));
    REQUIRE(pos + 12 + len + 4 <= s.size());
    const std::string data = s.substr(pos + 12, len);
    CHECK(uint32_t(le(s, pos + 12 + len, 4)) == mask(crc32c(data.data(), data.size())));
    recs.push_back(data);
    pos += 12 + len + 4;
  }
  return recs;
}

struct Scalar {
  double wall_time;
  int64_t step;
  std::string tag;
  float value;
};

// Decodes a scalar Event (wall_time, step, summary{value{tag, simple_value}...}).
std::vector<Scalar> scalars_of(const std::string& event) {
  double wall = -1;
  int64_t step = 0;
  std::vector<Scalar> out;
  for (const Field& f : decode(event)) {
    if (f.number == 1) {
      REQUIRE(f.wire == 1);
      wall = as_double(f.num);
    } else if (f.number == 2) {
      REQUIRE(f.wire == 0);
      step = int64_t(f.num);
    } else if (f.number == 5) {
      REQUIRE(f.wire == 2);
      for (const Field& v : decode(f.bytes)) {
        REQUIRE(v.number == 1);
        REQUIRE(v.wire == 2);
        Scalar sc{0, 0, "", NAN};
        for (const Field& vf : decode(v.bytes)) {
          if (vf.number == 1) {
            REQUIRE(vf.wire == 2);
            sc.tag = vf.bytes;
          } else if (vf.number == 2) {
            REQUIRE(vf.wire == 5);
            sc.value = as_float(vf.num);
          } else FAIL("unexpected Value field " << vf.number);
        }
        out.push_back(sc);
      }
    } else {
      FAIL("unexpected Event field " << f.number);
    }
  }
  for (auto& sc : out) sc.wall_time = wall, sc.step = step;
  return out;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST_CASE("crc32c matches the Castagnoli check value", "[utils]") {
  const char* s = "123456789";
  CHECK(crc32c(s, 9) == 0xE3069283u);
  CHECK(crc32c(s, 0) == 0u);
  CHECK(crc32c(s + 4, 5, crc32c(s, 4)) == 0xE3069283u);  // continuation
  // 32 zero bytes: the iSCSI (RFC 3720) test vector
  const std::string zeros(32, '\0');
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);
  CHECK(masked_crc32c(s, 9) == mask(0xE3069283u));
}

TEST_CASE("protobuf varints", "[utils]") {
  std::string out;
  tfrecord::put_varint(out, 300);
  CHECK(out == std::string("\xac\x02", 2));
  out.clear();
  tfrecord::put_int64(out, 2, -1);  // a negative int64 takes 10 bytes
  CHECK(out.size() == 11);
  size_t pos = 1;
  CHECK(int64_t(read_varint(out, pos)) == -1);
}

TEST_CASE("SummaryWriter writes an event file that decodes back", "[utils]") {
  const fs::path dir = kiln_test::fresh_dir("tb", /*create=*/false) / "nested" / "run";  // created by the writer
  std::string path;
  const double t0 = unix_time_now();
  {
    SummaryWriter w(dir.string());
    path = w.path();
    w.add_scalar("train/loss", 2.5, 0);
    w.add_scalar("train/loss", 0.42, 100);
    w.flush();
    CHECK(read_records(path).size() == 3);  // flushed: visible before the writer closes
    w.add_scalars({{"test/accuracy", 0.9125}, {"lr", 3e-3}}, 200);
    w.add_scalar("big_step", -1.5, int64_t(1) << 40, 1234.5);
    // no flush: the destructor writes the rest
  }
  const auto files = event_files(dir);
  REQUIRE(files.size() == 1);
  CHECK(files[0].string() == path);
  const std::string name = files[0].filename().string();
  const std::string stamp = name.substr(std::strlen("events.out.tfevents."));
  const int64_t secs = std::stoll(stamp.substr(0, stamp.find('.')));
  CHECK(std::abs(double(secs) - t0) < 5);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  CHECK(stamp.substr(stamp.find('.') + 1) == host);

  const auto recs = read_records(files[0]);
  REQUIRE(recs.size() == 5);

  // the first event: wall_time + file_version
  const auto first = decode(recs[0]);
  REQUIRE(first.size() == 2);
  CHECK(first[0].number == 1);
  CHECK(first[0].wire == 1);
  CHECK(std::abs(as_double(first[0].num) - t0) < 5);
  CHECK(first[1].number == 3);
  CHECK(first[1].wire == 2);
  CHECK(first[1].bytes == "brain.Event:2");

  auto s1 = scalars_of(recs[1]);
  REQUIRE(s1.size() == 1);
  CHECK(s1[0].tag == "train/loss");
  CHECK(s1[0].value == 2.5f);
  CHECK(s1[0].step == 0);
  CHECK(std::abs(s1[0].wall_time - t0) < 5);
  auto s2 = scalars_of(recs[2]);
  REQUIRE(s2.size() == 1);
  CHECK(s2[0].value == 0.42f);
  CHECK(s2[0].step == 100);
  auto s3 = scalars_of(recs[3]);
  REQUIRE(s3.size() == 2);
  CHECK(s3[0].tag == "test/accuracy");
  CHECK(s3[0].value == 0.9125f);
  CHECK(s3[1].tag == "lr");
  CHECK(s3[1].value == 3e-3f);
  CHECK(s3[0].step == 200);
  auto s4 = scalars_of(recs[4]);
  REQUIRE(s4.size() == 1);
  CHECK(s4[0].step == (int64_t(1) << 40));
  CHECK(s4[0].value == -1.5f);
  CHECK(s4[0].wall_time == 1234.5);
  fs::remove_all(dir.parent_path().parent_path());
}

TEST_CASE("SummaryWriter: two writers in one folder get two files; errors name the path", "[utils]") {
  const fs::path dir = kiln_test::fresh_dir("tb2", /*create=*/false);
  {
    SummaryWriter a(dir.string()), b(dir.string());
    CHECK(a.path() != b.path());
    a.add_scalar("x", 1, 1);
    b.add_scalar("x", 2, 1);
    b.close();
    CHECK_THROWS_WITH(b.add_scalar("x", 3, 2), Catch::Contains(b.path()));
  }
  CHECK(event_files(dir).size() == 2);
  // a log "directory" that is a file
  const fs::path file = dir / "plain-file";
  std::ofstream(file) << "x";
  CHECK_THROWS_WITH(SummaryWriter(file.string()), Catch::Contains("plain-file"));
  fs::remove_all(dir);
}
