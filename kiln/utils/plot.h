#pragma once
// Line plots as PNG files, with no plotting library: the training curves of kiln-train
// (loss / accuracy / lr panels) and the LR finder's loss-vs-lr curve.
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
// letters, and . - + : / ( ) % , _ =). Points that are NaN or infinite (or <= 0 on a log axis)
// are skipped and break the line; a series with few points also gets a marker per point; a
// panel without any finite point says "no data". The PNG is encoded with stb_image_write and
// written atomically (a temporary file renamed over `path`).
#include <cstdint>
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
  struct Rect { int x0, y0, x1, y1; };  // [x0, x1) x [y0, y1)
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  std::vector<Rect> panels;     // each panel's plot area (inside the axes box)
  const uint8_t* pixel(int x, int y) const { return &rgb[(static_cast<size_t>(y) * width + x) * 3]; }
};

// Draws the plot in memory (what write_line_plot_png encodes).
PlotImage render_line_plot(const std::string& title, const std::vector<Series>& series,
                           const PlotOptions& options = PlotOptions());
void write_line_plot_png(const std::string& path, const std::string& title,
                         const std::vector<Series>& series,
                         const PlotOptions& options = PlotOptions());
// Encodes any RGB image as a PNG file (atomically); errors name the path.
void write_png(const std::string& path, int width, int height, const std::vector<uint8_t>& rgb);

// The tick positions an axis from lo to hi gets (1, 2 or 5 times a power of ten apart), and
// the label a tick gets; exposed for tests.
std::vector<double> nice_ticks(double lo, double hi, int target = 5);
std::string tick_label(double v, double step);

}  // namespace kiln::utils
