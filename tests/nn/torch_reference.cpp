#include "tests/nn/torch_reference.h"

#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace kiln_test {
namespace {

using Tables = std::map<std::string, std::vector<double>>;

Tables read_tables(const std::string& file) {
  const std::string path = std::string(KILN_TORCH_REFERENCE) + "/" + file + ".json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("torch_reference: cannot open " + path);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("torch_reference: " + path + " is not valid JSON: " + e.what());
  }
  Tables tables;
  for (const auto& [name, table] : doc.items()) {
    std::vector<double> values = table.at("values").get<std::vector<double>>();
    if (table.contains("shape")) {
      size_t n = 1;
      for (int64_t s : table["shape"].get<std::vector<int64_t>>()) n *= static_cast<size_t>(s);
      if (n != values.size()) {
        throw std::runtime_error("torch_reference: " + path + ": " + name + " has " + std::to_string(values.size()) +
                                 " values, its shape " + table["shape"].dump() + " " + std::to_string(n));
      }
    }
    tables.emplace(name, std::move(values));
  }
  return tables;
}

}  // namespace

const std::vector<double>& torch_reference(const std::string& file, const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, Tables> files;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = files.find(file);
  if (it == files.end()) it = files.emplace(file, read_tables(file)).first;
  const auto t = it->second.find(name);
  if (t == it->second.end()) throw std::runtime_error("torch_reference: no table " + name + " in " + file + ".json");
  return t->second;
}

}  // namespace kiln_test
