#include "kiln/utils/plot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "kiln/core/error.h"

// stb_image_write, compiled into this file only, with internal linkage so it cannot clash with
// another copy in a user's program.
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wall"
#pragma GCC diagnostic ignored "-Wextra"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#endif
#include <stb/stb_image_write.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

namespace kiln::utils {

namespace {

// ------------------------------------------------------------------------------ 5x7 font
struct Glyph {
  char c;
  const char* rows[7];
};

// clang-format off
const Glyph kGlyphs[] = {
  {'0', {".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."}},
  {'1', {"..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."}},
  {'2', {".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"}},
  {'3', {"#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."}},
  {'4', {"...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."}},
  {'5', {"#####", "#....", "####.", "....#", "....#", "#...#", ".###."}},
  {'6', {"..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."}},
  {'7', {"#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."}},
  {'8', {".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."}},
  {'9', {".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."}},
  {'A', {".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
  {'B', {"####.", "#...#", "#...#", "####.", "#...#", "#...#", "####."}},
  {'C', {".###.", "#...#", "#....", "#....", "#....", "#...#", ".###."}},
  {'D', {"###..", "#..#.", "#...#", "#...#", "#...#", "#..#.", "###.."}},
  {'E', {"#####", "#....", "#....", "####.", "#....", "#....", "#####"}},
  {'F', {"#####", "#....", "#....", "####.", "#....", "#....", "#...."}},
  {'G', {".###.", "#...#", "#....", "#.###", "#...#", "#...#", ".####"}},
  {'H', {"#...#", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
  {'I', {".###.", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."}},
  {'J', {"..###", "...#.", "...#.", "...#.", "...#.", "#..#.", ".##.."}},
  {'K', {"#...#", "#..#.", "#.#..", "##...", "#.#..", "#..#.", "#...#"}},
  {'L', {"#....", "#....", "#....", "#....", "#....", "#....", "#####"}},
  {'M', {"#...#", "##.##", "#.#.#", "#.#.#", "#...#", "#...#", "#...#"}},
  {'N', {"#...#", "#...#", "##..#", "#.#.#", "#..##", "#...#", "#...#"}},
  {'O', {".###.", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
  {'P', {"####.", "#...#", "#...#", "####.", "#....", "#....", "#...."}},
  {'Q', {".###.", "#...#", "#...#", "#...#", "#.#.#", "#..#.", ".##.#"}},
  {'R', {"####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#"}},
  {'S', {".####", "#....", "#....", ".###.", "....#", "....#", "####."}},
  {'T', {"#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."}},
  {'U', {"#...#", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
  {'V', {"#...#", "#...#", "#...#", "#...#", "#...#", ".#.#.", "..#.."}},
  {'W', {"#...#", "#...#", "#...#", "#.#.#", "#.#.#", "#.#.#", ".#.#."}},
  {'X', {"#...#", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "#...#"}},
  {'Y', {"#...#", "#...#", ".#.#.", "..#..", "..#..", "..#..", "..#.."}},
  {'Z', {"#####", "....#", "...#.", "..#..", ".#...", "#....", "#####"}},
  {'a', {".....", ".....", ".###.", "....#", ".####", "#...#", ".####"}},
  {'b', {"#....", "#....", "#.##.", "##..#", "#...#", "#...#", "####."}},
  {'c', {".....", ".....", ".###.", "#....", "#....", "#...#", ".###."}},
  {'d', {"....#", "....#", ".##.#", "#..##", "#...#", "#...#", ".####"}},
  {'e', {".....", ".....", ".###.", "#...#", "#####", "#....", ".###."}},
  {'f', {"..##.", ".#..#", ".#...", "###..", ".#...", ".#...", ".#..."}},
  {'g', {".####", "#...#", "#...#", "#...#", ".####", "....#", ".###."}},  // descender
  {'h', {"#....", "#....", "#.##.", "##..#", "#...#", "#...#", "#...#"}},
  {'i', {"..#..", ".....", ".##..", "..#..", "..#..", "..#..", ".###."}},
  {'j', {"...#.", ".....", "..##.", "...#.", "...#.", "#..#.", ".##.."}},
  {'k', {"#....", "#....", "#..#.", "#.#..", "##...", "#.#..", "#..#."}},
  {'l', {".##..", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."}},
  {'m', {".....", ".....", "##.#.", "#.#.#", "#.#.#", "#...#", "#...#"}},
  {'n', {".....", ".....", "#.##.", "##..#", "#...#", "#...#", "#...#"}},
  {'o', {".....", ".....", ".###.", "#...#", "#...#", "#...#", ".###."}},
  {'p', {"####.", "#...#", "#...#", "#...#", "####.", "#....", "#...."}},  // descender
  {'q', {".####", "#...#", "#...#", "#...#", ".####", "....#", "....#"}},  // descender
  {'r', {".....", ".....", "#.##.", "##..#", "#....", "#....", "#...."}},
  {'s', {".....", ".....", ".####", "#....", ".###.", "....#", "####."}},
  {'t', {".#...", ".#...", "###..", ".#...", ".#...", ".#..#", "..##."}},
  {'u', {".....", ".....", "#...#", "#...#", "#...#", "#..##", ".##.#"}},
  {'v', {".....", ".....", "#...#", "#...#", "#...#", ".#.#.", "..#.."}},
  {'w', {".....", ".....", "#...#", "#...#", "#.#.#", "#.#.#", ".#.#."}},
  {'x', {".....", ".....", "#...#", ".#.#.", "..#..", ".#.#.", "#...#"}},
  {'y', {"#...#", "#...#", "#...#", "#...#", ".####", "....#", ".###."}},  // descender
  {'z', {".....", ".....", "#####", "...#.", "..#..", ".#...", "#####"}},
  {'.', {".....", ".....", ".....", ".....", ".....", ".##..", ".##.."}},
  {'-', {".....", ".....", ".....", "#####", ".....", ".....", "....."}},
  {'+', {".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."}},
  {':', {".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."}},
  {'/', {".....", "....#", "...#.", "..#..", ".#...", "#....", "....."}},
  {'(', {"...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."}},
  {')', {".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."}},
  {'%', {"##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##"}},
  {',', {".....", ".....", ".....", ".....", ".##..", "..#..", ".#..."}},
  {'_', {".....", ".....", ".....", ".....", ".....", ".....", "#####"}},
  {'=', {".....", ".....", "#####", ".....", "#####", ".....", "....."}},
  {'>', {".#...", "..#..", "...#.", "....#", "...#.", "..#..", ".#..."}},
  {'<', {"...#.", "..#..", ".#...", "#....", ".#...", "..#..", "...#."}},
  {'\'', {"..#..", "..#..", ".#...", ".....", ".....", ".....", "....."}},
  {'?', {".###.", "#...#", "....#", "...#.", "..#..", ".....", "..#.."}},
};
// clang-format on

constexpr int kGlyphW = 5, kGlyphH = 7, kAdvance = 6;
// Glyphs drawn two rows lower, so their tails hang below the baseline.
bool has_descender(unsigned char c) { return c == 'g' || c == 'p' || c == 'q' || c == 'y'; }

using GlyphBits = std::array<uint8_t, kGlyphH>;  // bit 4 = leftmost column

const std::array<GlyphBits, 128>& font() {
  static const std::array<GlyphBits, 128> table = [] {
    std::array<GlyphBits, 128> t{};
    GlyphBits unknown{};
    for (const Glyph& g : kGlyphs) {
      GlyphBits b{};
      for (int r = 0; r < kGlyphH; ++r)
        for (int c = 0; c < kGlyphW; ++c)
          if (g.rows[r][c] == '#') b[r] |= static_cast<uint8_t>(1u << (kGlyphW - 1 - c));
      t[static_cast<unsigned char>(g.c)] = b;
      if (g.c == '?') unknown = b;
    }
    for (int ch = 33; ch < 127; ++ch) {
      bool empty = true;
      for (uint8_t row : t[ch]) empty = empty && row == 0;
      if (empty) t[ch] = unknown;  // characters the font lacks print as '?'
    }
    return t;
  }();
  return table;
}

// ------------------------------------------------------------------------------ canvas
struct Rgb {
  uint8_t r, g, b;
};
Rgb rgb_of(uint32_t c) {
  return {static_cast<uint8_t>(c >> 16), static_cast<uint8_t>(c >> 8), static_cast<uint8_t>(c)};
}
constexpr Rgb kWhite{255, 255, 255}, kGrid{228, 228, 228}, kAxis{70, 70, 70}, kText{30, 30, 30}, kMuted{150, 150, 150};

const uint32_t kPalette[] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd,
                             0x8c564b, 0xe377c2, 0x7f7f7f, 0xbcbd22, 0x17becf};

struct Canvas {
  PlotImage& img;
  void set(int x, int y, Rgb c) {
    if (x < 0 || y < 0 || x >= img.width || y >= img.height) return;
    uint8_t* p = &img.rgb[(static_cast<size_t>(y) * img.width + x) * 3];
    p[0] = c.r, p[1] = c.g, p[2] = c.b;
  }
  void fill(int x0, int y0, int x1, int y1, Rgb c) {  // [x0, x1) x [y0, y1)
    for (int y = y0; y < y1; ++y)
      for (int x = x0; x < x1; ++x) set(x, y, c);
  }
  void hline(int x0, int x1, int y, Rgb c) { fill(std::min(x0, x1), y, std::max(x0, x1) + 1, y + 1, c); }
  void vline(int x, int y0, int y1, Rgb c) { fill(x, std::min(y0, y1), x + 1, std::max(y0, y1) + 1, c); }
  // Bresenham, `thick` x `thick` pen, clipped to `clip`.
  void line(int x0, int y0, int x1, int y1, Rgb c, int thick, const PlotImage::Rect& clip) {
    const int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
    const int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    for (;;) {
      dot(x0, y0, c, thick, clip);
      if (x0 == x1 && y0 == y1) break;
      const int e2 = 2 * err;
      if (e2 >= dy) err += dy, x0 += sx;
      if (e2 <= dx) err += dx, y0 += sy;
    }
  }
  void dot(int x, int y, Rgb c, int size, const PlotImage::Rect& clip) {
    const int lo = -(size - 1) / 2, hi = size / 2;
    for (int yy = y + lo; yy <= y + hi; ++yy)
      for (int xx = x + lo; xx <= x + hi; ++xx)
        if (xx >= clip.x0 && xx < clip.x1 && yy >= clip.y0 && yy < clip.y1) set(xx, yy, c);
  }
  void text(int x, int y, const std::string& s, Rgb c, int scale) {  // (x, y): top-left
    const auto& f = font();
    for (size_t i = 0; i < s.size(); ++i) {
      const auto ch = static_cast<unsigned char>(s[i]);
      if (ch >= 128) continue;
      const GlyphBits& g = f[ch];
      const int gx = x + static_cast<int>(i) * kAdvance * scale;
      const int gy = y + (has_descender(ch) ? 2 * scale : 0);
      for (int r = 0; r < kGlyphH; ++r)
        for (int col = 0; col < kGlyphW; ++col)
          if (g[r] & (1u << (kGlyphW - 1 - col)))
            fill(gx + col * scale, gy + r * scale, gx + (col + 1) * scale, gy + (r + 1) * scale, c);
    }
  }
};

int text_width(const std::string& s, int scale) {
  return s.empty() ? 0 : (static_cast<int>(s.size()) * kAdvance - 1) * scale;
}

// ------------------------------------------------------------------------------ axes
struct Axis {
  bool log = false;
  double lo = 0, hi = 1;  // in axis units (log10 of the value on a log axis)
  bool valid = false;
  double map(double v) const { return log ? std::log10(v) : v; }
  bool usable(double v) const { return std::isfinite(v) && (!log || v > 0); }
};

double nice_num(double x, bool round) {
  const double e = std::floor(std::log10(x));
  const double f = x / std::pow(10.0, e);
  double nf;
  if (round) nf = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  else nf = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  return nf * std::pow(10.0, e);
}

// Ticks of a log axis (lo, hi in log10 units) as values: the powers of ten inside, thinned to
// at most ~8; when fewer than two fit, the linear ticks of the value range.
std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> t;
  const int e0 = static_cast<int>(std::ceil(lo - 1e-9)), e1 = static_cast<int>(std::floor(hi + 1e-9));
  if (e1 - e0 + 1 >= 2) {
    const int stride = std::max(1, (e1 - e0 + 1 + 7) / 8);
    for (int e = e0; e <= e1; e += stride) t.push_back(std::pow(10.0, e));
    return t;
  }
  return nice_ticks(std::pow(10.0, lo), std::pow(10.0, hi));
}

struct PanelSpec {
  std::vector<const Series*> series;
  std::vector<Rgb> colors;
};

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  std::vector<double> t;
  if (!std::isfinite(lo) || !std::isfinite(hi) || hi <= lo) return t;
  const double step = nice_num((hi - lo) / std::max(1, target - 1), true);
  const double first = std::ceil(lo / step - 1e-9) * step;
  for (int i = 0; i < 100; ++i) {
    double v = first + i * step;
    if (v > hi + step * 1e-9) break;
    if (std::fabs(v) < step * 1e-9) v = 0;  // no "-0" or "1e-17"
    t.push_back(v);
  }
  return t;
}

namespace {
std::string tick_label_impl(double v, double step, bool force_sci) {
  char buf[48];
  if (v == 0) return "0";
  const double av = std::fabs(v);
  step = std::fabs(step);
  if (!force_sci && step >= 1e-3 && av < 1e5 && av >= 1e-3) {
    const int dec = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
    std::snprintf(buf, sizeof buf, "%.*f", std::min(dec, 6), v);
    return buf;
  }
  // scientific, compact: 1e-5, 2.5e6
  int e = static_cast<int>(std::floor(std::log10(av) + 1e-12));
  double m = v / std::pow(10.0, e);
  std::snprintf(buf, sizeof buf, "%.3g", m);
  if (std::string(buf) == "10" || std::string(buf) == "-10") {
    ++e;
    std::snprintf(buf, sizeof buf, "%.3g", m / 10);
  }
  return std::string(buf) + "e" + std::to_string(e);
}
}  // namespace

std::string tick_label(double v, double step) { return tick_label_impl(v, step, false); }

namespace {

// The series grouped into panels, in the order of their first appearance (series with the same
// panel number share one), each with its colour.
std::vector<PanelSpec> group_panels(const std::vector<Series>& series) {
  std::vector<PanelSpec> panels;
  std::vector<std::pair<int, size_t>> shared;  // panel number -> index in panels
  size_t auto_color = 0;
  for (const Series& se : series) {
    size_t pi = panels.size();
    if (se.panel >= 0) {
      auto it = std::find_if(shared.begin(), shared.end(), [&](const auto& p) { return p.first == se.panel; });
      if (it != shared.end()) pi = it->second;
      else shared.emplace_back(se.panel, pi);
    }
    if (pi == panels.size()) panels.emplace_back();
    panels[pi].series.push_back(&se);
    const uint32_t c = se.color == kAutoColor ? kPalette[auto_color++ % 10] : se.color;
    panels[pi].colors.push_back(rgb_of(c));
  }
  if (panels.empty()) panels.emplace_back();  // an empty plot still gets one "no data" panel
  return panels;
}

double x_of(const Series& se, size_t i) { return se.xs.empty() ? static_cast<double>(i) : se.xs[i]; }

// Sets the panel's axes to the range of its usable points, padded; returns how many there are
// (0: the axes stay invalid).
size_t fit_axes(const PanelSpec& P, Axis& ax, Axis& ay) {
  if (!P.series.empty()) ax.log = P.series[0]->log_x, ay.log = P.series[0]->log_y;
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  size_t usable_points = 0;
  for (const Series* se : P.series)
    for (size_t i = 0; i < se->ys.size(); ++i) {
      const double x = x_of(*se, i), y = se->ys[i];
      if (!ax.usable(x) || !ay.usable(y)) continue;
      ++usable_points;
      xmin = std::min(xmin, ax.map(x)), xmax = std::max(xmax, ax.map(x));
      ymin = std::min(ymin, ay.map(y)), ymax = std::max(ymax, ay.map(y));
    }
  if (usable_points == 0) return 0;
  if (xmax - xmin <= 1e-12 * std::max(1.0, std::fabs(xmax))) xmin -= 0.5, xmax += 0.5;
  if (ymax - ymin <= 1e-12 * std::max(1.0, std::fabs(ymax))) {
    const double pad = ay.log ? 0.5 : (ymax == 0 ? 1.0 : std::fabs(ymax) * 0.1);
    ymin -= pad, ymax += pad;
  } else {
    const double pad = (ymax - ymin) * 0.05;
    ymin -= pad, ymax += pad;
  }
  ax.lo = xmin, ax.hi = xmax, ay.lo = ymin, ay.hi = ymax;
  ax.valid = ay.valid = true;
  return usable_points;
}

// An axis's ticks (values, not axis units) and their labels, one style per axis: when a label
// needs the 1e-5 form, all of them take it.
struct Ticks {
  std::vector<double> values;
  std::vector<std::string> labels;
};
Ticks ticks_of(const Axis& a) {
  Ticks t;
  t.values = !a.valid ? std::vector<double>{} : a.log ? log_ticks(a.lo, a.hi) : nice_ticks(a.lo, a.hi);
  for (bool sci : {false, true}) {
    t.labels.clear();
    bool any_sci = false;
    for (size_t i = 0; i < t.values.size(); ++i) {
      const double v = t.values[i];
      const double step = a.log ? v : (t.values.size() > 1 ? t.values[1] - t.values[0] : std::fabs(v));
      t.labels.push_back(tick_label_impl(v, step, sci));
      any_sci = any_sci || t.labels.back().find('e') != std::string::npos;
    }
    if (!any_sci) break;
  }
  return t;
}

// One panel's plot area and axes: where a point goes in pixels.
struct Frame {
  PlotImage::Rect area;
  Axis ax, ay;
  double px(double v) const { return area.x0 + (v - ax.lo) / (ax.hi - ax.lo) * (area.x1 - 1 - area.x0); }
  double py(double v) const { return area.y1 - 1 - (v - ay.lo) / (ay.hi - ay.lo) * (area.y1 - 1 - area.y0); }
};

// The heading (the series' names in their colours), grid, ticks, labels and box of a panel.
void draw_frame(Canvas& cv, const Frame& f, const PanelSpec& P, const Ticks& xt, const Ticks& yt, int top,
                const PlotOptions& opt, int s) {
  const int line_h = kGlyphH * s;
  const PlotImage::Rect& area = f.area;
  int hx = area.x0;
  for (size_t k = 0; k < P.series.size(); ++k) {
    const std::string& name = P.series[k]->name.empty() ? std::string("series") : P.series[k]->name;
    cv.fill(hx, top + 6 + line_h / 2 - 1, hx + 4 * s + 4, top + 6 + line_h / 2 + 2, P.colors[k]);
    hx += 4 * s + 10;
    cv.text(hx, top + 6, name, P.colors[k], s);
    hx += text_width(name, s) + 6 * s + 8;
  }
  const int tick = 2 + 2 * s;
  for (size_t i = 0; i < yt.values.size(); ++i) {
    const int y = static_cast<int>(std::lround(f.py(f.ay.map(yt.values[i]))));
    if (y < area.y0 || y >= area.y1) continue;
    cv.hline(area.x0, area.x1 - 1, y, kGrid);
    cv.hline(area.x0 - tick, area.x0 - 1, y, kAxis);
    cv.text(area.x0 - tick - 3 - text_width(yt.labels[i], s), y - line_h / 2, yt.labels[i], kText, s);
  }
  int last_label_end = -1000000;
  for (size_t i = 0; i < xt.values.size(); ++i) {
    const int x = static_cast<int>(std::lround(f.px(f.ax.map(xt.values[i]))));
    if (x < area.x0 || x >= area.x1) continue;
    cv.vline(x, area.y0, area.y1 - 1, kGrid);
    cv.vline(x, area.y1, area.y1 + tick - 1, kAxis);
    const int w = text_width(xt.labels[i], s);
    const int lx = std::clamp(x - w / 2, 0, cv.img.width - w);
    if (lx > last_label_end + 2 * s) {  // skip labels that would overlap
      cv.text(lx, area.y1 + tick + 4, xt.labels[i], kText, s);
      last_label_end = lx + w;
    }
  }
  if (!opt.x_label().empty())
    cv.text(area.x1 - text_width(opt.x_label(), s), area.y1 + tick + 4 + line_h + 6, opt.x_label(), kMuted, s);
  cv.hline(area.x0 - 1, area.x1, area.y0 - 1, kAxis);
  cv.hline(area.x0 - 1, area.x1, area.y1, kAxis);
  cv.vline(area.x0 - 1, area.y0 - 1, area.y1, kAxis);
  cv.vline(area.x1, area.y0 - 1, area.y1, kAxis);
}

// Each series as a line through its usable points (a gap at an unusable one), with markers when
// it has few.
void draw_curves(Canvas& cv, const Frame& f, const PanelSpec& P, int s) {
  const int pen = std::max(2, s);
  for (size_t k = 0; k < P.series.size(); ++k) {
    const Series& se = *P.series[k];
    size_t n_usable = 0;
    for (size_t i = 0; i < se.ys.size(); ++i) n_usable += f.ax.usable(x_of(se, i)) && f.ay.usable(se.ys[i]);
    const bool markers = n_usable <= 40;
    bool have_prev = false;
    int x_prev = 0, y_prev = 0;
    for (size_t i = 0; i < se.ys.size(); ++i) {
      const double xv = x_of(se, i), yv = se.ys[i];
      if (!f.ax.usable(xv) || !f.ay.usable(yv)) {
        have_prev = false;  // a gap in the line
        continue;
      }
      const int x = static_cast<int>(std::lround(f.px(f.ax.map(xv))));
      const int y = static_cast<int>(std::lround(f.py(f.ay.map(yv))));
      if (have_prev) cv.line(x_prev, y_prev, x, y, P.colors[k], pen, f.area);
      if (markers) cv.dot(x, y, P.colors[k], pen + 3, f.area);
      x_prev = x, y_prev = y, have_prev = true;
    }
  }
}

}  // namespace

PlotImage render_line_plot(const std::string& title, const std::vector<Series>& series, const PlotOptions& opt) {
  KILN_CHECK(opt.width() >= 200 && opt.width() <= 16384, "plot: width ", opt.width(), " is outside [200, 16384]");
  KILN_CHECK(opt.panel_height() >= 80 && opt.panel_height() <= 16384, "plot: panel height ", opt.panel_height(),
             " is outside [80, 16384]");
  const int s = std::clamp(opt.text_scale(), 1, 8);
  for (const Series& se : series)
    KILN_CHECK(se.xs.empty() || se.xs.size() == se.ys.size(), "plot: series '", se.name, "' has ", se.xs.size(),
               " x values for ", se.ys.size(), " y values");
  const std::vector<PanelSpec> panels = group_panels(series);
  const int line_h = kGlyphH * s;
  const int title_h = title.empty() ? 8 : line_h + 16;
  PlotImage img;
  img.width = opt.width();
  img.height = title_h + opt.panel_height() * static_cast<int>(panels.size()) + 4;
  img.rgb.assign(static_cast<size_t>(img.width) * img.height * 3, 255);
  Canvas cv{img};
  if (!title.empty()) cv.text((img.width - text_width(title, s)) / 2, 8, title, kText, s);

  for (size_t pi = 0; pi < panels.size(); ++pi) {
    const PanelSpec& P = panels[pi];
    const int top = title_h + static_cast<int>(pi) * opt.panel_height();
    Frame f;
    const size_t usable_points = fit_axes(P, f.ax, f.ay);
    const Ticks xt = ticks_of(f.ax), yt = ticks_of(f.ay);
    int ylabel_w = text_width("0.0", s);
    for (const auto& l : yt.labels) ylabel_w = std::max(ylabel_w, text_width(l, s));
    f.area.x0 = 10 + ylabel_w + 10;
    f.area.x1 = img.width - 20;
    f.area.y0 = top + line_h + 14;
    f.area.y1 = top + opt.panel_height() - (line_h + 10) - (opt.x_label().empty() ? 0 : line_h + 6) - 6;
    KILN_CHECK(f.area.y1 - f.area.y0 >= 20 && f.area.x1 - f.area.x0 >= 40, "plot: panel height ", opt.panel_height(),
               " / width ", opt.width(), " leave no room for the plot at text scale ", s);
    img.panels.push_back(f.area);
    draw_frame(cv, f, P, xt, yt, top, opt, s);
    if (usable_points > 0) {
      draw_curves(cv, f, P, s);
    } else {
      const std::string msg = "no data";
      cv.text((f.area.x0 + f.area.x1 - text_width(msg, s)) / 2, (f.area.y0 + f.area.y1 - line_h) / 2, msg, kMuted, s);
    }
  }
  return img;
}

void write_png(const std::string& path, int width, int height, const std::vector<uint8_t>& rgb) {
  KILN_CHECK(width > 0 && height > 0 && rgb.size() == static_cast<size_t>(width) * static_cast<size_t>(height) * 3,
             "write_png: ", rgb.size(), " bytes for a ", width, "x", height, " RGB image ('", path, "')");
  namespace fs = std::filesystem;
  const std::string tmp = path + ".tmp";
  const int ok = stbi_write_png(tmp.c_str(), width, height, 3, rgb.data(), width * 3);
  if (!ok) {
    std::error_code ec;
    fs::remove(tmp, ec);
    KILN_FAIL("write_png: cannot write '", path, "' (does its folder exist?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    KILN_FAIL("write_png: cannot rename '", tmp, "' to '", path, "': ", ec.message());
  }
}

void write_line_plot_png(const std::string& path, const std::string& title, const std::vector<Series>& series,
                         const PlotOptions& options) {
  const PlotImage img = render_line_plot(title, series, options);
  write_png(path, img.width, img.height, img.rgb);
}

// ------------------------------------------------------------------------------ bar charts
namespace {

// Ticks of a log bar axis (lo, hi in log10 units) as values: 1, 2 and 5 times powers of ten,
// thinned to the powers of ten when there are more than ~10; a narrow range falls back to the
// linear ticks of its values.
std::vector<double> log_ticks_125(double lo, double hi) {
  std::vector<double> t;
  for (int e = static_cast<int>(std::floor(lo)) - 1; e <= static_cast<int>(std::ceil(hi)); ++e)
    for (double m : {1.0, 2.0, 5.0}) {
      const double v = m * std::pow(10.0, e), lv = std::log10(v);
      if (lv >= lo - 1e-9 && lv <= hi + 1e-9) t.push_back(v);
    }
  if (t.size() > 10) {
    std::vector<double> decades;
    for (double v : t)
      if (std::fabs(std::log10(v) - std::round(std::log10(v))) < 1e-9) decades.push_back(v);
    if (decades.size() >= 2) return decades;
  }
  if (t.size() < 2) return nice_ticks(std::pow(10.0, lo), std::pow(10.0, hi));
  return t;
}

// The x range (in axis units) that holds the origin and every drawable value, padded 5%.
Axis bar_axis(const std::vector<Bar>& bars, const BarChartOptions& opt) {
  Axis ax;
  ax.log = opt.log_x();
  double lo = INFINITY, hi = -INFINITY;
  auto take = [&](double v) {
    if (!ax.usable(v)) return;
    lo = std::min(lo, ax.map(v)), hi = std::max(hi, ax.map(v));
  };
  take(opt.origin());
  for (const Bar& b : bars) take(b.value), take(b.lo), take(b.hi), take(b.marker);
  if (!(lo <= hi)) lo = ax.log ? -0.5 : 0, hi = ax.log ? 0.5 : 1;  // nothing drawable
  if (hi - lo < 1e-9) lo -= ax.log ? 0.3 : 0.5, hi += ax.log ? 0.3 : 0.5;
  const double pad = (hi - lo) * 0.05;
  ax.lo = lo - pad, ax.hi = hi + pad, ax.valid = true;
  return ax;
}

// Shortens a label to `max_w` pixels, ending it with ".." when cut.
std::string fit_label(const std::string& s, int max_w, int scale) {
  if (text_width(s, scale) <= max_w) return s;
  std::string t = s;
  while (!t.empty() && text_width(t + "..", scale) > max_w) t.pop_back();
  return t + "..";
}

// One legend entry: a swatch drawn by `swatch` then the text; returns the x after it.
template <class Swatch>
int legend_entry(Canvas& cv, int x, int y, int line_h, int s, const std::string& text, Swatch swatch) {
  swatch(x, y + line_h / 2);
  x += 6 * s + 8;
  cv.text(x, y, text, kText, s);
  return x + text_width(text, s) + 8 * s;
}

// Where values go across a bar chart's plot area.
struct BarScale {
  Axis ax;
  PlotImage::Rect area;
  int px(double v) const {
    return static_cast<int>(std::lround(area.x0 + (ax.map(v) - ax.lo) / (ax.hi - ax.lo) * (area.x1 - 1 - area.x0)));
  }
};

// Vertical grid lines with tick marks and labels under the plot area, and the axis label.
void draw_bar_ticks(Canvas& cv, const BarScale& sc, const BarChartOptions& opt, int s) {
  const Axis& ax = sc.ax;
  const PlotImage::Rect& area = sc.area;
  const std::vector<double> ticks = ax.log ? log_ticks_125(ax.lo, ax.hi) : nice_ticks(ax.lo, ax.hi);
  int last_label_end = -1000000;
  for (double t : ticks) {
    if (!ax.usable(t)) continue;
    const int x = sc.px(t);
    if (x < area.x0 || x >= area.x1) continue;
    cv.vline(x, area.y0, area.y1 - 1, kGrid);
    cv.vline(x, area.y1, area.y1 + 3 + s, kAxis);
    const std::string l = tick_label_impl(t, ax.log ? t : (ticks.size() > 1 ? ticks[1] - ticks[0] : t), false);
    const int w = text_width(l, s), lx = std::clamp(x - w / 2, 0, cv.img.width - w);
    if (lx > last_label_end + 2 * s) {  // skip labels that would overlap
      cv.text(lx, area.y1 + 6 + s, l, kText, s);
      last_label_end = lx + w;
    }
  }
  if (!opt.x_label().empty())
    cv.text(area.x1 - text_width(opt.x_label(), s), area.y1 + 6 + s + kGlyphH * s + 6, opt.x_label(), kMuted, s);
}

}  // namespace

PlotImage render_bar_chart(const std::string& title, const std::vector<Bar>& bars, const BarChartOptions& opt) {
  KILN_CHECK(opt.width() >= 300 && opt.width() <= 16384, "bar chart: width ", opt.width(), " is outside [300, 16384]");
  KILN_CHECK(opt.bar_height() >= 8 && opt.bar_height() <= 1024, "bar chart: bar height ", opt.bar_height(),
             " is outside [8, 1024]");
  KILN_CHECK(!opt.log_x() || opt.origin() > 0, "bar chart: a log axis needs an origin > 0, not ", opt.origin());
  const int s = std::clamp(opt.text_scale(), 1, 8), line_h = kGlyphH * s;
  const bool legend = !opt.marker_label().empty() || !opt.whisker_label().empty();
  const int title_h = (title.empty() ? 8 : line_h + 16) + (legend ? line_h + 10 : 0);
  const int rows = std::max<int>(1, static_cast<int>(bars.size()));
  const int axis_h = line_h + 14 + (opt.x_label().empty() ? 0 : line_h + 6) + 6;

  PlotImage img;
  img.width = opt.width();
  img.height = title_h + 6 + rows * opt.bar_height() + axis_h;
  img.rgb.assign(static_cast<size_t>(img.width) * img.height * 3, 255);
  Canvas cv{img};
  if (!title.empty()) cv.text((img.width - text_width(title, s)) / 2, 8, title, kText, s);

  // labels take what they need, up to 45% of the width
  int label_w = 0;
  for (const Bar& b : bars) label_w = std::max(label_w, text_width(b.label, s));
  label_w = std::min(label_w, img.width * 45 / 100);
  PlotImage::Rect area{10 + label_w + 10, title_h + 6, img.width - 20, title_h + 6 + rows * opt.bar_height()};
  KILN_CHECK(area.x1 - area.x0 >= 60, "bar chart: width ", opt.width(), " leaves no room for the bars");
  img.panels.push_back(area);

  const BarScale sc{bar_axis(bars, opt), area};
  const Axis& ax = sc.ax;
  auto px = [&sc](double v) { return sc.px(v); };
  const Rgb bar_c = rgb_of(opt.color()), below_c = rgb_of(opt.below_color()), marker_c = rgb_of(opt.marker_color()),
            whisker_c = rgb_of(opt.whisker_color());

  if (legend) {  // under the title: what the whiskers and markers mean
    int x = area.x0;
    const int y = title_h - line_h - 6;
    if (!opt.whisker_label().empty())
      x = legend_entry(cv, x, y, line_h, s, opt.whisker_label(), [&](int lx, int cy) {
        cv.hline(lx, lx + 6 * s, cy, whisker_c);
        cv.vline(lx, cy - 2 * s, cy + 2 * s, whisker_c);
        cv.vline(lx + 6 * s, cy - 2 * s, cy + 2 * s, whisker_c);
      });
    if (!opt.marker_label().empty())
      legend_entry(cv, x, y, line_h, s, opt.marker_label(),
                   [&](int lx, int cy) { cv.fill(lx + 2 * s, cy - 3 * s, lx + 4 * s, cy + 3 * s, marker_c); });
  }

  draw_bar_ticks(cv, sc, opt, s);

  const int x_origin = px(opt.origin());
  for (size_t i = 0; i < bars.size(); ++i) {
    const Bar& b = bars[i];
    const int top = area.y0 + static_cast<int>(i) * opt.bar_height(), cy = top + opt.bar_height() / 2;
    img.panels.push_back({area.x0, top, area.x1, top + opt.bar_height()});
    cv.text(10 + label_w - text_width(fit_label(b.label, label_w, s), s), cy - line_h / 2,
            fit_label(b.label, label_w, s), kText, s);
    const int half = std::max(2, opt.bar_height() * 3 / 10);
    if (ax.usable(b.value)) {
      const int xv = std::clamp(px(b.value), area.x0, area.x1 - 1);
      cv.fill(std::min(x_origin, xv), cy - half, std::max(x_origin, xv) + 1, cy + half,
              b.value >= opt.origin() ? bar_c : below_c);
    }
    if (ax.usable(b.lo) && ax.usable(b.hi)) {
      const int x0 = px(std::min(b.lo, b.hi)), x1 = px(std::max(b.lo, b.hi)), cap = std::max(2, half - 2);
      cv.hline(x0, x1, cy, whisker_c);
      cv.vline(x0, cy - cap, cy + cap, whisker_c);
      cv.vline(x1, cy - cap, cy + cap, whisker_c);
    }
    if (ax.usable(b.marker)) {
      const int xm = px(b.marker);
      cv.fill(xm - s, cy - half - 3, xm + s + 1, cy + half + 3, marker_c);
    }
    if (!ax.usable(b.value) && !b.note.empty())  // over the marker, so it stays readable
      cv.text(x_origin + 6, cy - line_h / 2, b.note, kMuted, s);
  }
  // the origin line and the box, over the bars
  cv.vline(x_origin, area.y0, area.y1 - 1, kAxis);
  cv.hline(area.x0 - 1, area.x1, area.y0 - 1, kAxis);
  cv.hline(area.x0 - 1, area.x1, area.y1, kAxis);
  cv.vline(area.x0 - 1, area.y0 - 1, area.y1, kAxis);
  cv.vline(area.x1, area.y0 - 1, area.y1, kAxis);
  if (bars.empty()) cv.text((area.x0 + area.x1 - text_width("no data", s)) / 2, area.y0 + 4, "no data", kMuted, s);
  return img;
}

void write_bar_chart_png(const std::string& path, const std::string& title, const std::vector<Bar>& bars,
                         const BarChartOptions& options) {
  const PlotImage img = render_bar_chart(title, bars, options);
  write_png(path, img.width, img.height, img.rgb);
}

}  // namespace kiln::utils
