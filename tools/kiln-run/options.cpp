// Parses kiln-run's options. Accepts "--name value" and "--name=value", and each name with '-'
// or '_' between words (torchrun accepts both, and scripts written for it use either).
#include "options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace kiln_run {
namespace {

// The ranks are processes on one machine; a bound keeps a typo from becoming a fork bomb.
constexpr long kMaxProcsPerNode = 4096;
constexpr long kMaxNodes = 1 << 20;

long parse_int(const std::string& name, const std::string& text, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE) {
    throw UsageError("--" + name + " needs an integer, got '" + text + "'");
  }
  if (v < lo || v > hi) {
    throw UsageError("--" + name + " must be in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " + text);
  }
  return v;
}

double parse_seconds(const std::string& name, const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v) || v < 0) {
    throw UsageError("--" + name + " needs a number of seconds >= 0, got '" + text + "'");
  }
  return v;
}

std::string canonical(std::string name) {
  for (char& c : name) {
    if (c == '_') c = '-';
  }
  return name;
}

}  // namespace

std::string usage_text() {
  return "usage: kiln-run [--nproc-per-node N] [--nnodes M] [--node-rank R]\n"
         "                [--master-addr ADDR] [--master-port PORT] [--no-prefix]\n"
         "                [--] PROGRAM [ARGS...]\n"
         "\n"
         "Starts N processes of PROGRAM on this node (node R of M), each with RANK, WORLD_SIZE,\n"
         "LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT set, and\n"
         "OMP_NUM_THREADS (unless already set) to this machine's cores divided among the N.\n"
         "Output lines are prefixed with \"[rank R] \". SIGINT/SIGTERM are forwarded to the ranks;\n"
         "when one rank fails the others are stopped and kiln-run exits with its status.\n"
         "\n"
         "  --nproc-per-node N   processes on this node (default 1)\n"
         "  --nnodes M           nodes in the job (default 1)\n"
         "  --node-rank R        this node's index, 0..M-1 (default 0)\n"
         "  --master-addr ADDR   address of rank 0's store (default 127.0.0.1)\n"
         "  --master-port PORT   port of rank 0's store (default 29500)\n"
         "  --no-prefix          pass the ranks' output through without \"[rank R] \"\n"
         "  -h, --help           this text\n"
         "Options may also be written --name=value and with '_' for '-' (--nproc_per_node).\n";
}

Options parse_options(int argc, char** argv) {
  Options opt;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      opt.help = true;
      return opt;
    }
    // The first word not starting with '-' is the program; everything after it is its own.
    if (arg.size() < 2 || arg[0] != '-') break;
    if (arg.compare(0, 2, "--") != 0) throw UsageError("unknown option '" + arg + "'");

    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    name = canonical(name);
    auto take_value = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) throw UsageError("--" + name + " needs a value");
      return argv[++i];
    };

    if (name == "nproc-per-node") {
      opt.nproc_per_node = static_cast<int>(parse_int(name, take_value(), 1, kMaxProcsPerNode));
    } else if (name == "nnodes") {
      opt.nnodes = static_cast<int>(parse_int(name, take_value(), 1, kMaxNodes));
    } else if (name == "node-rank") {
      opt.node_rank = static_cast<int>(parse_int(name, take_value(), 0, kMaxNodes - 1));
    } else if (name == "master-addr") {
      opt.master_addr = take_value();
      if (opt.master_addr.empty()) throw UsageError("--master-addr needs a non-empty address");
    } else if (name == "master-port") {
      opt.master_port = static_cast<int>(parse_int(name, take_value(), 1, 65535));
    } else if (name == "kill-timeout") {
      opt.kill_timeout = parse_seconds(name, take_value());
    } else if (name == "no-prefix") {
      if (has_value) throw UsageError("--no-prefix takes no value");
      opt.prefix = false;
    } else {
      throw UsageError("unknown option '--" + name + "'");
    }
  }
  for (; i < argc; ++i) opt.program.push_back(argv[i]);

  if (opt.program.empty()) throw UsageError("no program to run");
  if (opt.node_rank >= opt.nnodes) {
    throw UsageError("--node-rank " + std::to_string(opt.node_rank) + " is not below --nnodes " +
                     std::to_string(opt.nnodes));
  }
  if (static_cast<long long>(opt.nnodes) * opt.nproc_per_node > std::numeric_limits<int>::max()) {
    throw UsageError("--nnodes times --nproc-per-node is too large");
  }
  return opt;
}

}  // namespace kiln_run
