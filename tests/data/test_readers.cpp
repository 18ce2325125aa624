// Dataset readers: IDX (raw and gzip), MNIST-style folders, the real Fashion-MNIST, CIFAR, text.
#include <catch2/catch.hpp>

#include "data_test_util.h"

namespace D = kiln::data;
using kiln_test::read_bytes;
using kiln_test::TempDir;
using kiln_test::write_bytes;

namespace {
kiln::Tensor images(int64_t n, int64_t h = 28, int64_t w = 28) {
  auto t = kiln::empty({n, h, w}, kiln::DType::U8);
  auto* p = t.data_ptr<uint8_t>();
  for (int64_t k = 0; k < t.numel(); ++k) p[k] = static_cast<uint8_t>(k * 31 + 7);
  return t;
}
kiln::Tensor labels(int64_t n, int mod = 10) {
  auto t = kiln::empty({n}, kiln::DType::U8);
  for (int64_t k = 0; k < n; ++k) t.data_ptr<uint8_t>()[k] = static_cast<uint8_t>(k % mod);
  return t;
}
void gzip_bytes(const std::string& path, const std::string& bytes) { D::write_whole_file(path, bytes, /*gzip=*/true); }
}  // namespace

TEST_CASE("IDX round trip, raw and gzip", "[data][idx]") {
  TempDir dir;
  auto img = images(5, 4, 3);
  for (bool gz : {false, true}) {
    std::string p = dir.file(gz ? "a.idx.gz" : "a.idx");
    D::write_idx(p, img, gz);
    auto back = D::read_idx(p);
    REQUIRE(back.sizes() == kiln::IntList{5, 4, 3});
    REQUIRE(kiln::equal(back, img));
  }
  auto f = kiln::randn({7, 2});
  D::write_idx(dir.file("f.idx"), f);
  REQUIRE(kiln::equal(D::read_idx(dir.file("f.idx")), f));
}

TEST_CASE("corrupt IDX files are rejected with the path", "[data][idx]") {
  TempDir dir;
  std::string good = dir.file("good.idx");
  D::write_idx(good, images(4, 5, 5));
  std::string bytes = read_bytes(good);

  SECTION("bad magic") {
    for (bool gz : {false, true}) {
      std::string bad = bytes;
      bad[0] = 0x1f;  // not 0
      bad[2] = 0x42;
      std::string p = dir.file(gz ? "magic.idx.gz" : "magic.idx");
      gz ? gzip_bytes(p, bad) : write_bytes(p, bad);
      REQUIRE_THROWS_WITH(D::read_idx(p), Catch::Contains(p) && Catch::Contains("magic"));
    }
  }
  SECTION("truncated") {
    for (bool gz : {false, true}) {
      std::string p = dir.file(gz ? "short.idx.gz" : "short.idx");
      std::string cut = bytes.substr(0, bytes.size() - 10);
      gz ? gzip_bytes(p, cut) : write_bytes(p, cut);
      REQUIRE_THROWS_WITH(D::read_idx(p), Catch::Contains(p) && Catch::Contains("truncated"));
    }
    // A gzip stream cut in the middle.
    std::string p = dir.file("cutgz.idx.gz");
    gzip_bytes(p, bytes);
    std::string z = read_bytes(p);
    write_bytes(p, z.substr(0, z.size() / 2));
    REQUIRE_THROWS_WITH(D::read_idx(p), Catch::Contains(p));
  }
  SECTION("count in the header larger or smaller than the data") {
    std::string more = bytes;
    more[7] = 5;  // 4 -> 5 images
    write_bytes(dir.file("more.idx"), more);
    REQUIRE_THROWS_WITH(D::read_idx(dir.file("more.idx")),
                        Catch::Contains(dir.file("more.idx")) && Catch::Contains("truncated"));
    std::string fewer = bytes;
    fewer[7] = 3;
    gzip_bytes(dir.file("fewer.idx.gz"), fewer);
    REQUIRE_THROWS_WITH(D::read_idx(dir.file("fewer.idx.gz")),
                        Catch::Contains(dir.file("fewer.idx.gz")) && Catch::Contains("trailing"));
  }
  SECTION("corrupt gzip checksum") {
    std::string p = dir.file("crc.idx.gz");
    gzip_bytes(p, bytes);
    std::string z = read_bytes(p);
    z[z.size() - 6] ^= 0x5a;  // inside the CRC32 trailer
    write_bytes(p, z);
    REQUIRE_THROWS_WITH(D::read_idx(p), Catch::Contains(p));
  }
  SECTION("missing file") { REQUIRE_THROWS_WITH(D::read_idx(dir.file("nope.idx")), Catch::Contains("nope.idx")); }
}

TEST_CASE("MNIST-style folders: loading and validation", "[data][idx]") {
  TempDir dir;
  D::write_idx(dir.file("t10k-images-idx3-ubyte.gz"), images(12), true);
  D::write_idx(dir.file("t10k-labels-idx1-ubyte"), labels(12), false);
  D::MNIST ds(dir.path, D::Split::Test);
  REQUIRE(ds.size() == 12);
  auto ex = ds.get(3);
  REQUIRE(ex.input.sizes() == kiln::IntList{1, 28, 28});
  REQUIRE(ex.input.dtype() == kiln::DType::U8);
  REQUIRE(ex.target.item<int64_t>() == 3);
  REQUIRE(kiln::equal(ex.input[0], images(12)[3]));

  SECTION("label and image counts must agree") {
    D::write_idx(dir.file("t10k-labels-idx1-ubyte"), labels(11), false);
    REQUIRE_THROWS_WITH(D::MNIST(dir.path, D::Split::Test),
                        Catch::Contains("12 images") && Catch::Contains("11 labels"));
  }
  SECTION("labels out of range") {
    D::write_idx(dir.file("t10k-labels-idx1-ubyte"), labels(12, 13), false);
    REQUIRE_THROWS_WITH(D::MNIST(dir.path, D::Split::Test),
                        Catch::Contains("t10k-labels-idx1-ubyte") && Catch::Contains("label 10"));
  }
  SECTION("a missing file names the Debian package") {
    REQUIRE_THROWS_WITH(D::FashionMNIST(dir.path, D::Split::Train),
                        Catch::Contains("train-images-idx3-ubyte") && Catch::Contains("dataset-fashion-mnist"));
  }
}

TEST_CASE("the real Fashion-MNIST loads", "[data][idx][fashion]") {
  if (!D::file_exists(std::string(D::FashionMNIST::kDefaultRoot) + "/train-images-idx3-ubyte.gz") &&
      !D::file_exists(std::string(D::FashionMNIST::kDefaultRoot) + "/train-images-idx3-ubyte")) {
    WARN("skipped: " << D::FashionMNIST::kDefaultRoot << " is absent (apt install dataset-fashion-mnist)");
    return;
  }
  D::FashionMNIST train;
  D::FashionMNIST test(D::FashionMNIST::kDefaultRoot, D::Split::Test);
  REQUIRE(train.size() == 60000);
  REQUIRE(test.size() == 10000);
  REQUIRE(train.images().sizes() == kiln::IntList{60000, 1, 28, 28});
  for (const auto* ds : {&train, &test}) {
    auto t = ds->targets();
    REQUIRE(t.min().item<int64_t>() == 0);
    REQUIRE(t.max().item<int64_t>() == 9);
  }
  REQUIRE(train.classes()[9] == "Ankle boot");
}

TEST_CASE("CIFAR binary files: loading and validation", "[data][cifar]") {
  TempDir dir;
  auto record = [](int label0, int label1, int nlabels, int fill) {
    std::string r;
    r.push_back(static_cast<char>(label0));
    if (nlabels == 2) r.push_back(static_cast<char>(label1));
    for (int k = 0; k < 3072; ++k) r.push_back(static_cast<char>((k + fill) & 0xff));
    return r;
  };
  std::string ten;
  for (int i = 0; i < 7; ++i) ten += record(i, 0, 1, i);
  write_bytes(dir.file("test_batch.bin"), ten);
  D::CIFAR10 c10(dir.path, D::Split::Test);
  REQUIRE(c10.size() == 7);
  auto ex = c10.get(5);
  REQUIRE(ex.input.sizes() == kiln::IntList{3, 32, 32});
  REQUIRE(ex.target.item<int64_t>() == 5);
  REQUIRE(ex.input[0][0][1].item<int64_t>() == 6);

  std::string hundred = record(3, 77, 2, 0) + record(19, 99, 2, 1);
  write_bytes(dir.file("train.bin"), hundred);
  REQUIRE(D::CIFAR100(dir.path, D::Split::Train).get(1).target.item<int64_t>() == 99);
  REQUIRE(D::CIFAR100(dir.path, D::Split::Train, /*fine=*/false).get(1).target.item<int64_t>() == 19);

  write_bytes(dir.file("test_batch.bin"), ten.substr(0, ten.size() - 100));
  REQUIRE_THROWS_WITH(D::CIFAR10(dir.path, D::Split::Test),
                      Catch::Contains(dir.file("test_batch.bin")) && Catch::Contains("truncated"));
  write_bytes(dir.file("test_batch.bin"), record(10, 0, 1, 0));
  REQUIRE_THROWS_WITH(D::CIFAR10(dir.path, D::Split::Test),
                      Catch::Contains(dir.file("test_batch.bin")) && Catch::Contains("label 10"));
  REQUIRE_THROWS_WITH(D::CIFAR10(dir.path, D::Split::Train), Catch::Contains("data_batch_1.bin"));
}

TEST_CASE("CharDataset windows, vocabulary and the fortunes corpus", "[data][text]") {
  D::CharDataset ds("hello world", 4);
  REQUIRE(ds.size() == 7);
  REQUIRE(ds.vocab() == " dehlorw");
  auto ex = ds.get(1);
  REQUIRE(ds.decode(ex.input) == "ello");
  REQUIRE(ds.decode(ex.target) == "llo ");
  REQUIRE(ds.decode(ds.encode("low")) == "low");
  REQUIRE_THROWS_AS(ds.encode("z"), kiln::Error);
  REQUIRE_THROWS_AS(D::CharDataset("abc", 3), kiln::Error);

  D::DataLoader loader(ds, D::LoaderOptions().batch_size(3).shuffle(true).seed(1));
  auto b = *loader.begin();
  REQUIRE(b.input.sizes() == kiln::IntList{3, 4});
  REQUIRE(!b.mask.defined());

  if (D::file_exists(std::string(D::CharDataset::kFortunesDir) + "/fortunes")) {
    auto f = D::CharDataset::fortunes(64);
    REQUIRE(f.size() > 100000);
    REQUIRE(f.vocab_size() > 60);
  } else {
    WARN("fortunes corpus absent (apt install fortunes): skipped");
  }
}

TEST_CASE("token shards: round trip, windows and corruption", "[data][text]") {
  TempDir dir;
  std::vector<uint16_t> toks;
  for (int i = 0; i < 101; ++i) toks.push_back(static_cast<uint16_t>(i * 600));
  D::write_token_shard(dir.file("a.tok"), toks);
  D::write_token_shard(dir.file("b.tok"), std::vector<uint16_t>(toks.begin(), toks.begin() + 25));
  REQUIRE(D::read_token_shard(dir.file("a.tok")) == toks);
  D::TokenShardDataset ds({dir.file("a.tok"), dir.file("b.tok")}, 10);
  REQUIRE(ds.size() == 10 + 2);  // 100/10 windows in a, 24/10 in b
  REQUIRE(ds.num_tokens() == 126);
  auto ex = ds.get(3);
  REQUIRE(ex.input.sizes() == kiln::IntList{10});
  REQUIRE(ex.input[0].item<int64_t>() == 30 * 600);
  REQUIRE(ex.target[9].item<int64_t>() == 40 * 600);
  REQUIRE(ds.get(11).input[0].item<int64_t>() == 10 * 600);

  std::string bytes = read_bytes(dir.file("a.tok"));
  std::string bad = bytes;
  bad[0] = 'X';
  write_bytes(dir.file("magic.tok"), bad);
  REQUIRE_THROWS_WITH(D::read_token_shard(dir.file("magic.tok")),
                      Catch::Contains("magic.tok") && Catch::Contains("magic"));
  bad = bytes;
  bad[4] = 9;
  write_bytes(dir.file("ver.tok"), bad);
  REQUIRE_THROWS_WITH(D::read_token_shard(dir.file("ver.tok")), Catch::Contains("version 9"));
  write_bytes(dir.file("short.tok"), bytes.substr(0, bytes.size() - 2));
  REQUIRE_THROWS_WITH(D::read_token_shard(dir.file("short.tok")),
                      Catch::Contains("short.tok") && Catch::Contains("truncated"));
  write_bytes(dir.file("long.tok"), bytes + "xx");
  REQUIRE_THROWS_WITH(D::read_token_shard(dir.file("long.tok")), Catch::Contains("trailing"));
}
