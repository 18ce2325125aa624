#pragma once
// Line plots and bar charts as PNG files, with no plotting library: the training curves of
// kiln-train (loss / accuracy / lr panels), the LR finder's loss-vs-lr curve, and kiln-guide's
// speed-up ratios (a horizontal bar chart, below).
//
//   using kiln::utils::Series;
//   kiln::utils::write_line_plot_png("out/curves.png", "fashion-mnist cnn", {
//       {"train loss", steps, losses, 0x1f77b4, 0},  // panel 0
//       {"test loss", epochs_x, test_losses, 0xd62728, 0},  // also panel 0
//       {"accuracy", epochs_x, accs},                 // a panel of its own, palette colour
//       {"lr", steps, lrs}});
//
// Panels are stacked top to bottom; each has a box, grid lines, tick marks with labels, and its
// series' names (in their colours) as its heading. Text uses a built-in 5x7 bitmap font (digits,
// letters, and . - + : / ( ) % , _ = < > '). Points that are NaN or infinite (or <= 0 on a log axis)
// are skipped and break the line; a series with few points also gets a marker per point; a
// panel without any finite point says "no data". The PNG is encoded with stb_image_write and
// written atomically (a temporary file renamed over `path`).
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/arg.h"

namespace kiln::utils {

constexpr uint32_t kAutoColor = 0xFFFFFFFFu;  // take the next colour of the palette

struct Series {
  std::string name;
  std::vector<double> xs;  // empty: 0, 1, 2, ...; otherwise one per y
  std::vector<double> ys;
  uint32_t color = kAutoColor;  // 0xRRGGBB
  int panel = -1;               // -1: a panel of its own; series with equal panel >= 0 share one
  bool log_x = false;           // log10 axes (the panel takes its first series' choice)
  bool log_y = false;
};

struct PlotOptions {
  KILN_ARG(int, width) = 900;         // pixels
  KILN_ARG(int, panel_height) = 240;  // pixels per panel
  // font pixel size of the title, headings and tick labels
  KILN_ARG(int, text_scale) = 2;
  KILN_ARG(std::string, x_label) = "step";
};

// An RGB image (row-major, 3 bytes a pixel) and where the panels' plot areas are in it.
struct PlotImage {
  struct Rect {
    int x0, y0, x1, y1;
  };  // [x0, x1) x [y0, y1)
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  std::vector<Rect> panels;  // each panel's plot area (inside the axes box)
  const uint8_t* pixel(int x, int y) const { return &rgb[(static_cast<size_t>(y) * width + x) * 3]; }
};

// Draws the plot in memory (what write_line_plot_png encodes).
PlotImage render_line_plot(const std::string& title, const std::vector<Series>& series,
                           const PlotOptions& options = PlotOptions());
void write_line_plot_png(const std::string& path, const std::string& title, const std::vector<Series>& series,
                         const PlotOptions& options = PlotOptions());
// Encodes any RGB image as a PNG file (atomically); errors name the path.
void write_png(const std::string& path, int width, int height, const std::vector<uint8_t>& rgb);

// ------------------------------------------------------------------------------ bar charts
//   kiln::utils::write_bar_chart_png("out/report.png", "speed-ups, with / baseline", {
//       {"4 AMP bf16 (cnn)", 0.61, 0.58, 0.66, 2.0},   // bar, whisker lo..hi, marker (a claim)
//       {"6 cuDNN autotuning", NAN, NAN, NAN, NAN, "needs a GPU"}},  // no value: the note instead
//       kiln::utils::BarChartOptions().log_x(true).origin(1).marker_label("claimed"));
//
// One row per bar, top to bottom in the given order, its label on the left. A bar goes from
// `origin` to `value` (in `color` at or above the origin, `below_color` under it), a whisker
// spans [lo, hi] with end caps, and a marker is a short thick vertical stroke in
// `marker_color`. On a log axis (where ratios belong: 0.5x and 2x lie equally far from 1x) the
// ticks are 1, 2 and 5 times powers of ten; values <= 0 are left out.
struct Bar {
  std::string label;
  double value = std::numeric_limits<double>::quiet_NaN();
  double lo = std::numeric_limits<double>::quiet_NaN();  // whisker; NaN: none
  double hi = std::numeric_limits<double>::quiet_NaN();
  double marker = std::numeric_limits<double>::quiet_NaN();  // NaN: none
  std::string note;                                          // drawn in place of the bar when `value` is not finite
};

struct BarChartOptions {
  KILN_ARG(int, width) = 1000;     // pixels
  KILN_ARG(int, bar_height) = 30;  // pixels per row
  KILN_ARG(int, text_scale) = 2;
  KILN_ARG(bool, log_x) = false;
  KILN_ARG(double, origin) = 0;  // where bars start (1 for ratios)
  KILN_ARG(std::string, x_label) = "";
  KILN_ARG(std::string, marker_label) = "";    // legend entry for the markers ("": no legend)
  KILN_ARG(std::string, whisker_label) = "";   // legend entry for the whiskers
  KILN_ARG(uint32_t, color) = 0x1f77b4;        // bars at or above the origin
  KILN_ARG(uint32_t, below_color) = 0xff7f0e;  // bars below it
  KILN_ARG(uint32_t, marker_color) = 0xd62728;
  KILN_ARG(uint32_t, whisker_color) = 0x333333;
};

// Draws the chart in memory; `panels` holds the plot area first, then one rect per bar's row
// (in the plot area's columns).
PlotImage render_bar_chart(const std::string& title, const std::vector<Bar>& bars,
                           const BarChartOptions& options = BarChartOptions());
void write_bar_chart_png(const std::string& path, const std::string& title, const std::vector<Bar>& bars,
                         const BarChartOptions& options = BarChartOptions());

// The tick positions an axis from lo to hi gets (1, 2 or 5 times a power of ten apart), and
// the label a tick gets; exposed for tests.
std::vector<double> nice_ticks(double lo, double hi, int target = 5);
std::string tick_label(double v, double step);

}  // namespace kiln::utils
