#pragma once
// Text datasets for language models.
//
// CharDataset: character-level (byte-level) modelling over any text. The vocabulary is the
// sorted set of bytes that occur in the text; sample i is the window input = text[i, i+T),
// target = text[i+1, i+T+1) as int64 token ids (views of one token tensor: zero-copy).
// The default corpus is Debian's fortunes package (/usr/share/games/fortunes).
//
// TokenShardDataset: pre-tokenised corpora stored as shards of uint16 token ids (GPT-2 style
// vocabularies fit). A shard file is a 16-byte little-endian header — magic "KTOK", uint32
// version (1), uint64 token count — followed by the tokens. Sample i is the i-th window of T+1
// tokens (stride T, so windows do not overlap except for the shifted target); shuffle them with a
// RandomSampler.
#include <string>
#include <vector>

#include "kiln/data/dataset.h"

namespace kiln::data {

class CharDataset : public Dataset {
 public:
  static constexpr const char* kFortunesDir = "/usr/share/games/fortunes";
  // Over `text` itself.
  CharDataset(const std::string& text, int64_t block_size);
  // Over the concatenation of the files (raw or gzip), in the order given.
  static CharDataset from_files(const std::vector<std::string>& paths, int64_t block_size);
  // Over every fortune file in `dir` (skipping the .dat indexes and .u8 links).
  static CharDataset fortunes(int64_t block_size, const std::string& dir = kFortunesDir);

  int64_t size() const override { return tokens_.numel() - block_size_; }
  Example get(int64_t index) const override;
  int64_t length(int64_t) const override { return block_size_; }

  int64_t block_size() const { return block_size_; }
  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }
  const std::string& vocab() const { return vocab_; }       // token id -> byte
  const Tensor& tokens() const { return tokens_; }          // the whole text as int64 ids
  std::vector<int64_t> encode(const std::string& s) const;  // throws on bytes not in the vocab
  std::string decode(const std::vector<int64_t>& ids) const;
  std::string decode(const Tensor& ids) const;

 private:
  int64_t block_size_;
  std::string vocab_;
  int16_t index_of_[256];
  Tensor tokens_;
};

// Writes a token shard (see above).
void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens);
// Reads and validates a shard: magic, version, and that the file holds exactly `count` tokens.
std::vector<uint16_t> read_token_shard(const std::string& path);

class TokenShardDataset : public Dataset {
 public:
  static constexpr uint32_t kMagic = 0x4B4F544Bu;  // the bytes "KTOK" read little-endian
  static constexpr uint32_t kVersion = 1;
  TokenShardDataset(const std::vector<std::string>& paths, int64_t block_size);
  int64_t size() const override { return static_cast<int64_t>(windows_.size()); }
  Example get(int64_t index) const override;  // input, target: int64 [T]
  int64_t length(int64_t) const override { return block_size_; }
  int64_t num_tokens() const;
  int64_t block_size() const { return block_size_; }

 private:
  int64_t block_size_;
  std::vector<std::vector<uint16_t>> shards_;
  std::vector<std::pair<int32_t, int64_t>> windows_;  // (shard, first token)
};

}  // namespace kiln::data
