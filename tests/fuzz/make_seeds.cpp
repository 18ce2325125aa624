// Writes the seed corpus of every fuzz target (tests/fuzz/corpus/<target>/seed-*): small valid
// files made by kiln's own writers, so the fuzzers start from inputs that reach deep into each
// reader. Run by scripts/fuzz.sh --seeds; its output is committed.
//   kiln-fuzz-seeds CORPUS_DIR
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <kiln/kiln.h>

#include "kiln/distributed/store/wire.h"
#include "tests/fuzz/checkpoint_setup.h"

namespace {

std::string g_root;

std::string seed(const std::string& target, const std::string& name) {
  const std::string dir = g_root + "/" + target;
  ::mkdir(dir.c_str(), 0755);
  return dir + "/seed-" + name;
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void safetensors_seeds() {
  kiln::nn::StateDict d;
  d.insert("f32", kiln::randn({2, 3}));
  d.insert("f16", kiln::randn({3}).to(kiln::DType::F16));
  d.insert("bf16", kiln::randn({2, 2}).to(kiln::DType::BF16));
  d.insert("f64", kiln::randn({1}).to(kiln::DType::F64));
  d.insert("i64", kiln::arange(0, 4, 1).to(kiln::DType::I64));
  d.insert("i32", kiln::arange(0, 3, 1).to(kiln::DType::I32));
  d.insert("u8", kiln::arange(0, 5, 1).to(kiln::DType::U8));
  d.insert("bool", kiln::arange(0, 2, 1).to(kiln::DType::Bool));
  kiln::save(d, seed("safetensors", "every-dtype.safetensors"), {{"format", "pt"}, {"note", "kiln seed"}});
  kiln::nn::StateDict e;
  e.insert("scalar", kiln::randn({}));
  e.insert("empty", kiln::randn({0, 4}));
  kiln::save(e, seed("safetensors", "scalar-and-empty.safetensors"));
}

void npy_seeds() {
  kiln::save_npy(kiln::randn({3, 4}), seed("npy", "f32.npy"));
  kiln::save_npy(kiln::randn({5}).to(kiln::DType::F64), seed("npy", "f64.npy"));
  kiln::save_npy(kiln::randn({2, 2}).to(kiln::DType::F16), seed("npy", "f16.npy"));
  kiln::save_npy(kiln::arange(0, 6, 1).to(kiln::DType::I64).view({2, 3}), seed("npy", "i64.npy"));
  kiln::save_npy(kiln::arange(0, 4, 1).to(kiln::DType::U8), seed("npy", "u8.npy"));
  kiln::save_npy(kiln::arange(0, 3, 1).to(kiln::DType::Bool), seed("npy", "bool.npy"));
  kiln::save_npy(kiln::randn({}), seed("npy", "scalar.npy"));
  // version 2 (a 4-byte header length), as NumPy writes for long headers
  std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }";
  dict.append((64 - (12 + dict.size() + 1) % 64) % 64, ' ');
  dict.push_back('\n');
  std::string b = "\x93NUMPY";
  b.push_back(2);
  b.push_back(0);
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>((dict.size() >> (8 * i)) & 0xff));
  b += dict;
  b += std::string("\x01\x00\x00\x00\x02\x00\x00\x00", 8);
  write_raw(seed("npy", "v2-i32.npy"), b);
}

void idx_seeds() {
  kiln::data::write_idx(seed("idx", "u8-images"), kiln::arange(0, 2 * 3 * 4, 1).to(kiln::DType::U8).view({2, 3, 4}));
  kiln::data::write_idx(seed("idx", "u8-labels.gz"), kiln::arange(0, 7, 1).to(kiln::DType::U8), /*gzip=*/true);
  kiln::data::write_idx(seed("idx", "i32"), kiln::arange(-3, 3, 1).to(kiln::DType::I32).view({2, 3}));
  kiln::data::write_idx(seed("idx", "f32"), kiln::randn({4}));
  kiln::data::write_idx(seed("idx", "f64.gz"), kiln::randn({2, 2}).to(kiln::DType::F64), /*gzip=*/true);
}

void cifar_seeds() {
  for (int label_bytes : {1, 2}) {
    std::string bytes;
    for (int r = 0; r < 2; ++r) {
      for (int l = 0; l < label_bytes; ++l) bytes.push_back(static_cast<char>(r + l + 1));
      for (int p = 0; p < 3 * 32 * 32; ++p) bytes.push_back(static_cast<char>((p * 7 + r) & 0xff));
    }
    write_raw(seed("cifar", label_bytes == 1 ? "cifar10-2-records.bin" : "cifar100-2-records.bin"), bytes);
  }
}

void text_seeds() {
  kiln::data::write_token_shard(seed("text", "shard.ktok"), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 65535});
  write_raw(seed("text", "prose.txt"), "Bad bytes and bad days: a reader answers with data or a clear error.\n");
  kiln::data::write_whole_file(seed("text", "prose.txt.gz"), "gzip-compressed text reads the same way.\n", true);
}

void checkpoint_seeds() {
  kiln_fuzz::CheckpointSetup s;
  kiln::Tensor loss = s.model.forward(kiln::randn({4, 3})).pow(2).mean();
  loss.backward();
  s.optimizer->step();
  s.scheduler->step();
  s.ema->update();
  kiln_train::Position pos;
  pos.epoch = 1;
  pos.batch_in_epoch = 2;
  pos.step = 3;
  kiln_train::save_checkpoint(seed("checkpoint", "after-one-step.safetensors"), s.options, s.model, *s.optimizer,
                              s.scheduler.get(), s.ema.get(), pos);
}

void store_seeds() {
  namespace wire = kiln::distributed::wire;
  auto bytes = [](const std::string& s) { return kiln::distributed::Bytes(s.begin(), s.end()); };
  std::vector<wire::Message> msgs = {
      {1, {bytes("rank/0/addr"), bytes("127.0.0.1:29500")}},       // SET
      {2, {wire::encode_int(30000), bytes("rank/1/addr")}},        // GET
      {3, {bytes("__kiln_store__/joined"), wire::encode_int(1)}},  // ADD
      {5, {wire::encode_int(1000), bytes("a"), bytes("b")}},       // WAIT
      {7, {}},                                                     // NUM_KEYS
  };
  std::string stream;
  for (const auto& m : msgs) {
    auto b = wire::encode_message(m);
    stream.append(b.begin(), b.end());
  }
  write_raw(seed("store_message", "requests"), stream);
  auto one = wire::encode_message(msgs[0]);
  write_raw(seed("store_message", "set"), std::string(one.begin(), one.end()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  ::mkdir(g_root.c_str(), 0755);
  kiln::manual_seed(7);
  safetensors_seeds();
  npy_seeds();
  idx_seeds();
  cifar_seeds();
  text_seeds();
  checkpoint_seeds();
  store_seeds();
  std::printf("seeds written under %s\n", g_root.c_str());
  return 0;
}
