#pragma once
// What an autotuner chose, keyed by a description of the problem (a convolution's direction,
// geometry and dtype): looked up before timing anything, stored after. cuDNN's algorithm choices
// and the CPU convolution's layout choices are kept in one each (docs/guide.md, speed-up 6).
// Thread-safe.
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace kiln {

template <class Choice> class AutotuneCache {
 public:
  std::optional<Choice> find(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  void store(const std::string& key, const Choice& choice) {
    std::lock_guard<std::mutex> lock(mutex_);
    map_[key] = choice;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    map_.clear();
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return map_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Choice> map_;
};

}  // namespace kiln
