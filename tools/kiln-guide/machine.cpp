#include "machine.h"

#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

namespace kiln_guide {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto b = line.find_first_not_of(" \t", colon + 1);
    return b == std::string::npos ? "" : line.substr(b);
  }
  return "";
}

int cpu_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}

std::vector<std::string> gpu_names() {
  std::vector<std::string> names;
  // popen through sh: a missing nvidia-smi is just an empty list
  FILE* p = ::popen("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null", "r");
  if (!p) return names;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) {
    std::string s = buf;
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
    if (!s.empty() && s.find("NVIDIA-SMI has failed") == std::string::npos && s.find("No devices") == std::string::npos)
      names.push_back(s);
  }
  if (::pclose(p) != 0) names.clear();  // nvidia-smi failed: no usable GPU
  return names;
}

std::string iso_date_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S%z", &tm);
  return buf;
}

std::string own_dir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

}  // namespace kiln_guide
