#pragma once
// What kiln-guide finds out about the machine it runs on: the CPU, the GPUs and the date.
#include <string>
#include <vector>

namespace kiln_guide {

std::string cpu_model();  // /proc/cpuinfo's "model name"; empty when unknown
int cpu_cores();          // logical processors this process may use
// The GPUs nvidia-smi lists (their names); empty without nvidia-smi or without a GPU.
std::vector<std::string> gpu_names();
std::string iso_date_now();  // local time, e.g. 2026-11-28T09:30:00+0000
// The folder of this executable (/proc/self/exe), where kiln-train is installed beside it.
std::string own_dir();

}  // namespace kiln_guide
