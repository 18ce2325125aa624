#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include <kiln/utils/plot.h>

namespace kiln_guide {
namespace {

using Json = nlohmann::ordered_json;  // keys in the order written

bool finite(double v) { return std::isfinite(v); }

Json number_or_null(double v) { return finite(v) ? Json(v) : Json(nullptr); }

Json pair_or_null(const std::pair<double, double>& p) {
  if (!finite(p.first) || !finite(p.second)) return nullptr;
  return Json::array({p.first, p.second});
}

Json text_or_null(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

const char* direction_text(Direction d) {
  return d == Direction::HigherIsBetter ? "higher is better" : "lower is better";
}

// 12345.6 -> "12,346"
std::string thousands(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", v);
  std::string digits = buf, out;
  const bool neg = !digits.empty() && digits[0] == '-';
  if (neg) digits.erase(0, 1);
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (neg ? "-" : "") + out;
}

// The number alone (no unit), as format_value writes it.
std::string format_number(double v, Unit u) {
  if (!finite(v)) return "-";
  char buf[64];
  switch (u) {
    case Unit::SamplesPerSecond: return thousands(v);
    case Unit::Bytes: std::snprintf(buf, sizeof buf, "%.1f", v / (1024.0 * 1024.0)); return buf;
    case Unit::Seconds: std::snprintf(buf, sizeof buf, "%.1f", v); return buf;
    case Unit::Accuracy: std::snprintf(buf, sizeof buf, "%.2f", 100 * v); return buf;
    case Unit::PerStep: std::snprintf(buf, sizeof buf, "%.2f", v); return buf;
    case Unit::Samples: return thousands(v);
  }
  return "?";
}

std::string unit_suffix(Unit u, const std::string& sample_word) {
  switch (u) {
    case Unit::SamplesPerSecond: return " " + sample_word + "/s";
    case Unit::Bytes: return " MiB";
    case Unit::Seconds: return " s";
    case Unit::Accuracy: return "%";
    case Unit::PerStep: return " per step";
    case Unit::Samples: return " samples";
  }
  return "";
}

std::string format_ratio(double r) {
  if (!finite(r)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", r);
  return buf;
}

// A Markdown table cell: no '|' or line break may end the cell early.
std::string md_cell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n' || c == '\r') out += ' ';
    else out += c;
  }
  return out;
}

void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << text;
    f.flush();
    if (!f) throw std::runtime_error("cannot write '" + tmp + "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw std::runtime_error("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

std::string machine_line(const Machine& m) {
  std::ostringstream os;
  os << "**Machine:** " << (m.cpu.empty() ? "unknown CPU" : m.cpu) << (m.label.empty() ? "" : " (" + m.label + ")")
     << ", " << m.cores << " cores, CPU kernels " << (m.cpu_isa.empty() ? "?" : m.cpu_isa)
     << "; GPU: " << (m.gpu.empty() ? "none" : m.gpu) << "; runs on the " << (m.device == "cuda" ? "GPU" : "CPU")
     << "; " << m.date << "; mode " << m.mode << " (" << m.rounds << (m.rounds == 1 ? " round" : " rounds")
     << " per side, alternating baseline and with); total " << format_duration(m.total_seconds) << ". kiln-train: `"
     << m.kiln_train << "`, kiln " << m.kiln_commit << ".";
  return os.str();
}

Json fit_json(const std::optional<MemoryFit>& f) {
  if (!f) return nullptr;
  auto side = [](const int64_t(&batches)[2], const LinearFit& l) {
    return Json{{"batches", Json::array({batches[0], batches[1]})},
                {"fixed_bytes", number_or_null(l.fixed)},
                {"bytes_per_sample", number_or_null(l.per_sample)}};
  };
  return {{"baseline", side(f->baseline_batches, f->baseline)}, {"with", side(f->with_batches, f->with)}};
}

std::string value_cell(const Row& r, const std::vector<double>& v) {
  if (r.status != kMeasured) return "-";
  return format_number(median(v), r.unit) + unit_suffix(r.unit, r.sample_word);
}

std::string spread_cell(const Row& r) {
  if (r.status != kMeasured) return "-";
  const auto b = spread(r.baseline_values), w = spread(r.with_values);
  return format_number(b.first, r.unit) + "-" + format_number(b.second, r.unit) + "; " +
         format_number(w.first, r.unit) + "-" + format_number(w.second, r.unit);
}

}  // namespace

double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::pair<double, double> spread(const std::vector<double>& v) {
  if (v.empty()) return {std::nan(""), std::nan("")};
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return {*lo, *hi};
}

double ratio(double baseline, double with, Direction d) {
  return d == Direction::HigherIsBetter ? with / baseline : baseline / with;
}

std::pair<double, double> ratio_range(const std::pair<double, double>& b, const std::pair<double, double>& w,
                                      Direction d) {
  // worst: the with side's worst against the baseline's best; best: the other way round
  if (d == Direction::HigherIsBetter) return {w.first / b.second, w.second / b.first};
  return {b.first / w.second, b.second / w.first};
}

LinearFit fit_peak(double batch_a, double peak_a, double batch_b, double peak_b) {
  if (batch_a == batch_b) return {};
  LinearFit f;
  f.per_sample = (peak_a - peak_b) / (batch_a - batch_b);
  f.fixed = peak_a - f.per_sample * batch_a;
  return f;
}

double largest_batch_within(const LinearFit& f, double budget) {
  if (!(f.per_sample > 0) || !finite(f.fixed) || !finite(budget)) return std::nan("");
  // the tolerance keeps a batch whose prediction equals the budget up to rounding
  return std::max(0.0, std::floor((budget - f.fixed) / f.per_sample + 1e-9));
}

std::string format_duration(double seconds) {
  char buf[32];
  const long t = std::max(0L, std::lround(seconds));
  if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm %02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

std::string format_value(double v, Unit u, const std::string& sample_word) {
  if (!finite(v)) return "-";
  return format_number(v, u) + unit_suffix(u, sample_word);
}

Json report_json(const Machine& m, const std::vector<Row>& rows) {
  Json machine = {{"cpu", m.cpu},
                  {"label", text_or_null(m.label)},
                  {"cores", m.cores},
                  {"cpu_isa", m.cpu_isa},
                  {"gpu", text_or_null(m.gpu)},
                  {"device", m.device},
                  {"date", m.date},
                  {"mode", m.mode},
                  {"rounds", m.rounds},
                  {"total_seconds", m.total_seconds},
                  {"kiln_train", m.kiln_train},
                  {"kiln_commit", m.kiln_commit}};
  Json out_rows = Json::array();
  for (const Row& r : rows) {
    const bool has = r.status == kMeasured;  // only measured rows carry numbers, never a stand-in
    const double b = has ? median(r.baseline_values) : NAN, w = has ? median(r.with_values) : NAN;
    Json spread_j = {{"baseline", has ? pair_or_null(spread(r.baseline_values)) : Json(nullptr)},
                     {"with", has ? pair_or_null(spread(r.with_values)) : Json(nullptr)}};
    out_rows.push_back({{"tip", r.tip},
                        {"name", r.name},
                        {"model", text_or_null(r.model)},
                        {"metric", text_or_null(r.metric)},
                        {"direction", r.metric.empty() ? Json(nullptr) : Json(direction_text(r.direction))},
                        {"baseline", number_or_null(b)},
                        {"with", number_or_null(w)},
                        {"ratio", has ? number_or_null(ratio(b, w, r.direction)) : Json(nullptr)},
                        {"spread", spread_j},
                        {"claim", r.claim},
                        {"source", r.source},
                        {"explanation", r.status == kFailed ? r.failure : r.explanation},
                        {"fit", has ? fit_json(r.fit) : Json(nullptr)},
                        {"status", r.status}});
  }
  return {{"machine", machine}, {"rows", out_rows}};
}

std::string report_markdown(const Machine& m, const std::vector<Row>& rows) {
  std::ostringstream os;
  os << "# kiln-guide: the PyTorch guides' speed-ups, measured with kiln\n\n"
     << machine_line(m) << "\n\n"
     << "Each row trains kiln-train with the speed-up off (baseline) and on (with), in alternating rounds; "
        "values are the medians of the rounds and the spread is each side's min-max. The ratio is > 1 when "
        "the speed-up helps: with / baseline where higher is better (throughput, accuracy, batch), baseline / "
        "with where lower is better (memory, time, host syncs). Claims are the guides' numbers, on their "
        "hardware.\n\n"
     << "| # | speed-up | model | metric | baseline | with | ratio | spread (baseline; with) | guides' claim | "
        "source | why kiln's number may differ | status |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows) {
    const double ra =
        r.status == kMeasured ? ratio(median(r.baseline_values), median(r.with_values), r.direction) : NAN;
    os << "| " << r.tip << " | " << md_cell(r.name) << " | " << (r.model.empty() ? "-" : r.model) << " | "
       << md_cell(r.metric.empty() ? "-" : r.metric + " (" + direction_text(r.direction) + ")") << " | "
       << value_cell(r, r.baseline_values) << " | " << value_cell(r, r.with_values) << " | " << format_ratio(ra)
       << " | " << spread_cell(r) << " | " << md_cell(r.claim) << " | " << md_cell(r.source) << " | "
       << md_cell(r.explanation) << " | " << r.status << " |\n";
  }
  os << "\n## Commands\n\nEach run's command, JSON summary and logs are in `runs/`.\n\n"
     << "| # | speed-up | baseline | with |\n|---|---|---|---|\n";
  for (const Row& r : rows)
    if (!r.baseline_command.empty())
      os << "| " << r.tip << " | " << md_cell(r.name) << " | `" << md_cell(r.baseline_command) << "` | `"
         << md_cell(r.with_command) << "` |\n";
  bool any_failed = false;
  for (const Row& r : rows) any_failed = any_failed || r.status == kFailed;
  if (any_failed) {
    os << "\n## Failed runs\n";
    for (const Row& r : rows)
      if (r.status == kFailed) os << "\n### " << r.tip << " " << r.name << "\n\n```\n" << r.failure << "\n```\n";
  }
  return os.str();
}

void write_report_png(const std::string& path, const Machine& m, const std::vector<Row>& rows) {
  std::vector<kiln::utils::Bar> bars;
  for (const Row& r : rows) {
    if (r.status == kNotMeasured) continue;  // nothing to draw, and the table says why
    kiln::utils::Bar b;
    b.label = std::to_string(r.tip) + " " + r.key + " (" + r.model + ")";
    b.marker = r.claimed_ratio;
    if (r.status == kMeasured) {
      b.value = ratio(median(r.baseline_values), median(r.with_values), r.direction);
      const auto rr = ratio_range(spread(r.baseline_values), spread(r.with_values), r.direction);
      b.lo = rr.first, b.hi = rr.second;
    } else {
      b.note = r.status;
    }
    bars.push_back(std::move(b));
  }
  const std::string title = "kiln-guide: a ratio above 1 means the speed-up helps (" +
                            std::string(m.device == "cuda" ? "GPU" : "CPU") + ", " + m.mode + ")";
  kiln::utils::write_bar_chart_png(path, title, bars,
                                   kiln::utils::BarChartOptions()
                                       .width(1200)
                                       .log_x(true)
                                       .origin(1)
                                       .x_label("ratio, log scale")
                                       .whisker_label("spread over the rounds")
                                       .marker_label("claimed by the guides"));
}

void write_report(const std::string& dir, const Machine& m, const std::vector<Row>& rows) {
  namespace fs = std::filesystem;
  write_atomically((fs::path(dir) / "report.json").string(), report_json(m, rows).dump(2) + "\n");
  write_atomically((fs::path(dir) / "report.md").string(), report_markdown(m, rows));
  write_report_png((fs::path(dir) / "report.png").string(), m, rows);
}

}  // namespace kiln_guide
