#include "kiln/data/text.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "kiln/data/file_reader.h"

namespace kiln::data {

// ---------------------------------------------------------------- CharDataset

CharDataset::CharDataset(const std::string& text, int64_t block_size) : block_size_(block_size) {
  KILN_CHECK(block_size >= 1, "CharDataset: block_size must be >= 1, got ", block_size);
  KILN_CHECK(static_cast<int64_t>(text.size()) > block_size, "CharDataset: the text has ", text.size(),
             " bytes; a block of ", block_size, " needs at least ", block_size + 1);
  bool seen[256] = {};
  for (unsigned char c : text) seen[c] = true;
  std::fill(std::begin(index_of_), std::end(index_of_), int16_t(-1));
  for (int c = 0; c < 256; ++c)
    if (seen[c]) {
      index_of_[c] = static_cast<int16_t>(vocab_.size());
      vocab_.push_back(static_cast<char>(c));
    }
  tokens_ = empty({static_cast<int64_t>(text.size())}, DType::I64);
  int64_t* p = tokens_.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) p[i] = index_of_[static_cast<unsigned char>(text[i])];
}

CharDataset CharDataset::from_files(const std::vector<std::string>& paths, int64_t block_size) {
  KILN_CHECK(!paths.empty(), "CharDataset::from_files: no files given");
  std::string text;
  for (const auto& p : paths) text += read_whole_file(p);
  KILN_CHECK(block_size < 1 || static_cast<int64_t>(text.size()) > block_size, "CharDataset::from_files: ", paths,
             " hold ", text.size(), " bytes; a block of ", block_size, " needs at least ", block_size + 1);
  return CharDataset(text, block_size);
}

CharDataset CharDataset::fortunes(int64_t block_size, const std::string& dir) {
  std::vector<std::string> files;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name.empty() || name[0] == '.') continue;
      auto ends = [&](const char* suf) {
        size_t n = std::strlen(suf);
        return name.size() >= n && name.compare(name.size() - n, n, suf) == 0;
      };
      if (ends(".dat") || ends(".u8")) continue;
      std::string path = dir + "/" + name;
      struct stat st;
      if (lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) files.push_back(path);
    }
    closedir(d);
  }
  KILN_CHECK(!files.empty(), "CharDataset::fortunes: no fortune files in ", dir,
             ". Install Debian's fortunes package (apt install fortunes fortunes-min), or use "
             "CharDataset::from_files with any text file");
  std::sort(files.begin(), files.end());
  return from_files(files, block_size);
}

Example CharDataset::get(int64_t index) const {
  KILN_CHECK(index >= 0 && index < size(), "CharDataset: index ", index, " out of range [0, ", size(), ")");
  return Example{tokens_.slice(0, index, index + block_size_), tokens_.slice(0, index + 1, index + 1 + block_size_)};
}

std::vector<int64_t> CharDataset::encode(const std::string& s) const {
  std::vector<int64_t> out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    KILN_CHECK(index_of_[c] >= 0, "CharDataset::encode: byte ", int(c), " is not in the vocabulary");
    out.push_back(index_of_[c]);
  }
  return out;
}

std::string CharDataset::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    KILN_CHECK(id >= 0 && id < vocab_size(), "CharDataset::decode: id ", id, " out of range [0, ", vocab_size(), ")");
    out.push_back(vocab_[static_cast<size_t>(id)]);
  }
  return out;
}

std::string CharDataset::decode(const Tensor& ids) const {
  Tensor t = ids.to(Device::cpu()).to(DType::I64).contiguous();
  const int64_t* p = t.data_ptr<int64_t>();
  return decode(std::vector<int64_t>(p, p + t.numel()));
}

// ---------------------------------------------------------------- token shards

namespace {
void put_le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
}  // namespace

void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  std::string bytes;
  put_le(bytes, TokenShardDataset::kMagic, 4);
  put_le(bytes, TokenShardDataset::kVersion, 4);
  put_le(bytes, tokens.size(), 8);
  for (uint16_t t : tokens) put_le(bytes, t, 2);
  // Atomic: write a temporary file, then rename over the target.
  std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  KILN_CHECK(f != nullptr, "write_token_shard: cannot create ", tmp);
  size_t w = std::fwrite(bytes.data(), 1, bytes.size(), f);
  int rc = std::fclose(f);
  KILN_CHECK(w == bytes.size() && rc == 0, "write_token_shard: writing ", tmp, " failed");
  KILN_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "write_token_shard: cannot rename ", tmp, " to ", path);
}

std::vector<uint16_t> read_token_shard(const std::string& path) {
  FileReader r(path);
  unsigned char h[16];
  r.read_exact(h, 16, "read_token_shard (header)");
  uint32_t magic = static_cast<uint32_t>(get_le(h, 4));
  uint32_t version = static_cast<uint32_t>(get_le(h + 4, 4));
  uint64_t count = get_le(h + 8, 8);
  KILN_CHECK(magic == TokenShardDataset::kMagic, "read_token_shard: ", path,
             " is not a token shard: bad magic number 0x", std::hex, magic, std::dec, " (expected \"KTOK\")");
  KILN_CHECK(version == TokenShardDataset::kVersion, "read_token_shard: ", path, " has version ", version,
             "; this kiln reads version ", TokenShardDataset::kVersion);
  KILN_CHECK(count < (uint64_t(1) << 40), "read_token_shard: ", path, " claims ", count, " tokens: corrupt header");
  r.expect_available(count * 2, "read_token_shard (tokens)");
  std::vector<uint16_t> tokens(count);
  std::vector<unsigned char> raw(count * 2);
  r.read_exact(raw.data(), raw.size(), "read_token_shard (tokens)");
  r.expect_end("read_token_shard");
  for (uint64_t i = 0; i < count; ++i) tokens[i] = static_cast<uint16_t>(get_le(&raw[2 * i], 2));
  return tokens;
}

TokenShardDataset::TokenShardDataset(const std::vector<std::string>& paths, int64_t block_size)
    : block_size_(block_size) {
  KILN_CHECK(block_size >= 1, "TokenShardDataset: block_size must be >= 1, got ", block_size);
  KILN_CHECK(!paths.empty(), "TokenShardDataset: no shard files given");
  for (const auto& p : paths) {
    shards_.push_back(read_token_shard(p));
    int64_t n = static_cast<int64_t>(shards_.back().size());
    int32_t s = static_cast<int32_t>(shards_.size() - 1);
    for (int64_t start = 0; start + block_size + 1 <= n; start += block_size) windows_.emplace_back(s, start);
  }
  KILN_CHECK(!windows_.empty(), "TokenShardDataset: no shard of ", paths, " holds ", block_size + 1,
             " tokens (a window of block_size + 1)");
}

int64_t TokenShardDataset::num_tokens() const {
  int64_t n = 0;
  for (const auto& s : shards_) n += static_cast<int64_t>(s.size());
  return n;
}

Example TokenShardDataset::get(int64_t index) const {
  KILN_CHECK(index >= 0 && index < size(), "TokenShardDataset: index ", index, " out of range [0, ", size(), ")");
  auto [s, start] = windows_[static_cast<size_t>(index)];
  const uint16_t* p = shards_[static_cast<size_t>(s)].data() + start;
  Tensor both = empty({block_size_ + 1}, DType::I64);
  int64_t* q = both.data_ptr<int64_t>();
  for (int64_t i = 0; i <= block_size_; ++i) q[i] = p[i];
  return Example{both.slice(0, 0, block_size_), both.slice(0, 1, block_size_ + 1)};
}

}  // namespace kiln::data
