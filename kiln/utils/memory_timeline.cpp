#include "kiln/utils/memory_timeline.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "kiln/core/error.h"
#include "kiln/core/escape.h"
#include "kiln/cuda/cuda.h"

namespace kiln::utils {

namespace {

using ::kiln::detail::html_escape;
using ::kiln::detail::json_escape;

std::string hex(uintptr_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::ofstream open_out(const std::string& path, const char* what) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  KILN_CHECK(f.good(), what, ": cannot open '", path, "' for writing");
  return f;
}

}  // namespace

void write_memory_trace(const std::vector<MemoryEvent>& events, const std::string& path) {
  std::ofstream f = open_out(path, "memory trace");
  f << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  f << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,"
       "\"args\":{\"name\":\"kiln caching allocator\"}}";
  char ts[64];
  for (const MemoryEvent& e : events) {
    std::snprintf(ts, sizeof(ts), "%.3f", e.time_us);
    f << ",\n{\"name\":\"allocated\",\"ph\":\"C\",\"ts\":" << ts
      << ",\"pid\":0,\"tid\":0,\"args\":{\"allocated\":" << e.allocated << "}}";
    f << ",\n{\"name\":\"reserved\",\"ph\":\"C\",\"ts\":" << ts
      << ",\"pid\":0,\"tid\":0,\"args\":{\"reserved\":" << e.reserved << "}}";
    std::string name = to_string(e.action);
    if (!e.label.empty()) name += " " + e.label;
    f << ",\n{\"name\":\"" << json_escape(name) << "\",\"ph\":\"i\",\"s\":\"p\",\"ts\":" << ts
      << ",\"pid\":0,\"tid\":0,\"args\":{\"action\":\"" << to_string(e.action) << "\",\"ptr\":\"" << hex(e.ptr)
      << "\",\"size\":" << e.size << ",\"stream\":\"" << hex(e.stream) << "\",\"label\":\"" << json_escape(e.label)
      << "\"}}";
  }
  f << "\n]}\n";
  KILN_CHECK(f.good(), "memory trace: writing '", path, "' failed");
}

void write_memory_timeline(const std::vector<MemoryEvent>& events, const std::string& title, const std::string& path) {
  const double W = 1000, H = 360, L = 90, R = 20, T = 20, B = 40;  // plot area margins
  const double pw = W - L - R, ph = H - T - B;
  double t_min = events.empty() ? 0 : events.front().time_us;
  double t_max = events.empty() ? 1 : events.back().time_us;
  if (t_max <= t_min) t_max = t_min + 1;
  size_t y_max = 1;
  for (const MemoryEvent& e : events) y_max = std::max({y_max, e.allocated, e.reserved});
  auto X = [&](double t) { return L + (t - t_min) / (t_max - t_min) * pw; };
  auto Y = [&](size_t v) { return T + ph - double(v) / double(y_max) * ph; };

  // Step lines; with many events, one column per pixel keeps the maximum of each series.
  auto series = [&](bool reserved) {
    std::ostringstream os;
    char buf[64];
    auto val = [&](const MemoryEvent& e) { return reserved ? e.reserved : e.allocated; };
    size_t prev = 0;
    double prev_x = L;
    std::snprintf(buf, sizeof(buf), "%.1f,%.1f", L, Y(0));
    os << buf;
    size_t i = 0;
    while (i < events.size()) {
      double x = X(events[i].time_us);
      int col = static_cast<int>(x);
      size_t hi = val(events[i]);
      size_t last = hi;
      size_t j = i + 1;
      for (; j < events.size() && static_cast<int>(X(events[j].time_us)) == col; ++j) {
        hi = std::max(hi, val(events[j]));
        last = val(events[j]);
      }
      (void)prev_x;
      std::snprintf(buf, sizeof(buf), " %.1f,%.1f %.1f,%.1f", x, Y(prev), x, Y(hi));
      os << buf;
      if (last != hi) {
        std::snprintf(buf, sizeof(buf), " %.1f,%.1f", x, Y(last));
        os << buf;
      }
      prev = last;
      prev_x = x;
      i = j;
    }
    std::snprintf(buf, sizeof(buf), " %.1f,%.1f", L + pw, Y(prev));
    os << buf;
    return os.str();
  };

  // Per-label totals for the table under the plot.
  struct LabelStats {
    size_t allocs = 0, bytes = 0, live = 0, peak_live = 0;
  };
  std::map<std::string, LabelStats> by_label;
  std::map<uintptr_t, std::string> live_label;
  size_t peak_alloc = 0, peak_res = 0;
  for (const MemoryEvent& e : events) {
    peak_alloc = std::max(peak_alloc, e.allocated);
    peak_res = std::max(peak_res, e.reserved);
    if (e.action == MemoryAction::Alloc) {
      std::string lab = e.label.empty() ? "(unlabelled)" : e.label;
      auto& s = by_label[lab];
      s.allocs++;
      s.bytes += e.size;
      s.live += e.size;
      s.peak_live = std::max(s.peak_live, s.live);
      live_label[e.ptr] = lab;
    } else if (e.action == MemoryAction::Free) {
      auto it = live_label.find(e.ptr);
      if (it != live_label.end()) {
        auto& s = by_label[it->second];
        s.live -= std::min(s.live, e.size);
        live_label.erase(it);
      }
    }
  }
  auto mib = [](size_t b) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.2f MiB", b / 1048576.0);
    return std::string(buf);
  };

  std::ofstream f = open_out(path, "memory timeline");
  f << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" << html_escape(title)
    << "</title>\n<style>body{font-family:sans-serif;margin:20px}"
       "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;"
       "text-align:right}th{background:#eee}</style></head><body>\n";
  f << "<h2>" << html_escape(title) << "</h2>\n<p>" << events.size() << " events; peak allocated " << mib(peak_alloc)
    << ", peak reserved " << mib(peak_res) << "</p>\n";
  f << "<svg width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H << "\">\n<rect x=\"" << L
    << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph << "\" fill=\"#fafafa\" stroke=\"#999\"/>\n";
  char buf[160];
  for (int k = 0; k <= 4; ++k) {  // y ticks
    size_t v = y_max / 4 * k;
    std::snprintf(buf, sizeof(buf), "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n",
                  L - 4, Y(v) + 4, mib(v).c_str());
    f << buf;
  }
  for (int k = 0; k <= 4; ++k) {  // x ticks
    double t = t_min + (t_max - t_min) * k / 4;
    std::snprintf(buf, sizeof(buf),
                  "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%.1f ms"
                  "</text>\n",
                  X(t), T + ph + 16, t / 1000.0);
    f << buf;
  }
  f << "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"1.5\" points=\"" << series(true) << "\"/>\n";
  f << "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"" << series(false) << "\"/>\n";
  f << "<text x=\"" << L + 10 << "\" y=\"" << T + 16
    << "\" font-size=\"12\" fill=\"#d62728\">reserved</text>\n<text x=\"" << L + 80 << "\" y=\"" << T + 16
    << "\" font-size=\"12\" fill=\"#1f77b4\">allocated</text>\n</svg>\n";
  f << "<h3>Allocations by label</h3>\n<table><tr><th>label</th><th>allocations</th>"
       "<th>total bytes</th><th>peak live</th></tr>\n";
  for (auto& [lab, s] : by_label)
    f << "<tr><td style=\"text-align:left\">" << html_escape(lab) << "</td><td>" << s.allocs << "</td><td>"
      << mib(s.bytes) << "</td><td>" << mib(s.peak_live) << "</td></tr>\n";
  f << "</table>\n</body></html>\n";
  KILN_CHECK(f.good(), "memory timeline: writing '", path, "' failed");
}

void export_cuda_memory_trace(const std::string& path_json, int device) {
  write_memory_trace(cuda::memory_history(device), path_json);
}

void export_cuda_memory_timeline(const std::string& path_html, int device) {
  write_memory_timeline(cuda::memory_history(device), "kiln memory timeline: cuda", path_html);
}

}  // namespace kiln::utils
