// write_line_plot_png: the PNG's signature and header are checked byte by byte, the file is
// decoded (stb_image) and compared with the in-memory rendering, and every panel is checked to
// hold pixels of its series' colour.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "kiln/utils/plot.h"
#include "tests/test_util.h"

#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#define STBI_ONLY_PNG
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wall"
#pragma GCC diagnostic ignored "-Wextra"
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
#include <stb/stb_image.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

namespace fs = std::filesystem;
using namespace kiln::utils;

using kiln_test::fresh_dir;
using kiln_test::slurp;

namespace {

uint32_t be32(const std::string& s, size_t off) {
  return uint32_t(uint8_t(s[off])) << 24 | uint32_t(uint8_t(s[off + 1])) << 16 | uint32_t(uint8_t(s[off + 2])) << 8 |
         uint32_t(uint8_t(s[off + 3]));
}

// pixels of colour c (0xRRGGBB) and pixels that are not white inside rect r
std::pair<int, int> census(const PlotImage& img, const PlotImage::Rect& r, uint32_t c) {
  int match = 0, ink = 0;
  for (int y = r.y0; y < r.y1; ++y)
    for (int x = r.x0; x < r.x1; ++x) {
      const uint8_t* p = img.pixel(x, y);
      match += p[0] == uint8_t(c >> 16) && p[1] == uint8_t(c >> 8) && p[2] == uint8_t(c);
      ink += !(p[0] == 255 && p[1] == 255 && p[2] == 255);
    }
  return {match, ink};
}

}  // namespace

TEST_CASE("nice_ticks and tick_label", "[utils]") {
  CHECK(nice_ticks(0, 1) == std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1});
  const auto t = nice_ticks(-0.05, 2.33);
  REQUIRE(t.size() >= 3);
  CHECK(t.front() == 0);
  CHECK(t.back() <= 2.33);
  CHECK(nice_ticks(1, 1).empty());
  CHECK(tick_label(0, 0.2) == "0");
  CHECK(tick_label(0.4, 0.2) == "0.4");
  CHECK(tick_label(0.25, 0.05) == "0.25");
  CHECK(tick_label(1500, 500) == "1500");
  CHECK(tick_label(-2, 1) == "-2");
  CHECK(tick_label(1e-5, 1e-5) == "1e-5");
  CHECK(tick_label(2.5e5, 5e4) == "2.5e5");
  CHECK(tick_label(0.001, 0.001) == "0.001");
}

TEST_CASE("write_line_plot_png draws stacked panels", "[utils]") {
  const fs::path dir = fresh_dir("plot");
  const std::string path = (dir / "curves.png").string();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();

  std::vector<double> steps, loss, lr;
  for (int i = 0; i < 938; ++i) {
    steps.push_back(i);
    loss.push_back(2.3 * std::exp(-i / 150.0) + 0.25 + 0.05 * std::sin(i * 0.7));
    lr.push_back(
        3e-3 * std::min(1.0, (i + 1) / 280.0) * (i < 280 ? 1 : 0.5 * (1 + std::cos(M_PI * (i - 280) / 658.0))) + 1e-6);
  }
  loss[400] = nan;  // skipped, the line breaks there
  loss[401] = inf;
  const std::vector<Series> series = {
      {"train loss", steps, loss, 0x1f77b4, 0},
      {"test loss", {469, 938}, {0.45, 0.33}, 0xd62728, 0},
      {"test accuracy", {469, 938}, {0.874, 0.912}, 0x2ca02c},
      {"lr", steps, lr, 0x9467bd, -1, false, /*log_y=*/true},
      {"grad norm", {}, {}},  // empty: a "no data" panel
  };
  const PlotOptions opt = PlotOptions().width(800).panel_height(200);
  const PlotImage img = render_line_plot("kiln-train cnn fashion-mnist", series, opt);
  write_line_plot_png(path, "kiln-train cnn fashion-mnist", series, opt);
  CHECK_FALSE(fs::exists(path + ".tmp"));

  const std::string png = slurp(path);
  REQUIRE(png.size() > 33);
  CHECK(png.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  CHECK(be32(png, 8) == 13);  // IHDR length
  CHECK(png.substr(12, 4) == "IHDR");
  CHECK(be32(png, 16) == 800);
  CHECK(be32(png, 20) == uint32_t(img.height));
  CHECK(img.height > 4 * 200);

  // the file decodes to exactly the rendered pixels
  int w = 0, h = 0, ch = 0;
  unsigned char* data = stbi_load(path.c_str(), &w, &h, &ch, 3);
  REQUIRE(data != nullptr);
  CHECK(w == 800);
  CHECK(h == img.height);
  CHECK(std::equal(img.rgb.begin(), img.rgb.end(), data));
  stbi_image_free(data);

  // four panels; each holds its series' colours, the empty one only axes and text
  REQUIRE(img.panels.size() == 4);
  for (size_t i = 1; i < img.panels.size(); ++i) CHECK(img.panels[i].y0 > img.panels[i - 1].y1);
  CHECK(census(img, img.panels[0], 0x1f77b4).first > 300);
  CHECK(census(img, img.panels[0], 0xd62728).first > 20);
  CHECK(census(img, img.panels[1], 0x2ca02c).first > 20);
  CHECK(census(img, img.panels[2], 0x9467bd).first > 300);
  const auto empty = census(img, img.panels[3], 0x1f77b4);
  CHECK(empty.first == 0);
  CHECK(empty.second > 0);                                 // grid-less box with "no data"
  CHECK(census(img, img.panels[0], 0x2ca02c).first == 0);  // colours stay in their panels

  fs::remove_all(dir);
}

TEST_CASE("plot edge cases and errors", "[utils]") {
  // nothing at all, only non-finite values, a single point, a constant series
  CHECK(render_line_plot("", {}).panels.size() == 1);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto img = render_line_plot(
      "t", {{"nan", {}, {nan, nan}, 0xff0000}, {"one", {}, {3.0}, 0x00ff00}, {"flat", {}, {2, 2, 2}, 0x0000ff}});
  REQUIRE(img.panels.size() == 3);
  CHECK(census(img, img.panels[0], 0xff0000).first == 0);
  CHECK(census(img, img.panels[1], 0x00ff00).first > 0);
  CHECK(census(img, img.panels[2], 0x0000ff).first > 0);

  CHECK_THROWS_WITH(render_line_plot("", {{"bad", {1, 2}, {1, 2, 3}}}),
                    Catch::Contains("bad") && Catch::Contains("2 x values for 3 y values"));
  CHECK_THROWS_WITH(write_line_plot_png("/nonexistent-dir/x.png", "", {{"a", {}, {1, 2}}}),
                    Catch::Contains("/nonexistent-dir/x.png"));
}
