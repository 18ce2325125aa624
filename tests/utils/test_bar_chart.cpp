// render_bar_chart / write_bar_chart_png: bar lengths on a log axis, the colours above and below
// the origin, whiskers, markers, notes in place of a missing value, and the PNG file.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "kiln/utils/plot.h"
#include "tests/test_util.h"

using namespace kiln::utils;

namespace {

bool is(const uint8_t* p, uint32_t c) {
  return p[0] == uint8_t(c >> 16) && p[1] == uint8_t(c >> 8) && p[2] == uint8_t(c);
}

// Columns of one line of a bar's row that have colour c: {count, first, last}. The line is a
// little above the centre by default, where a whisker's horizontal stroke does not cover the bar.
struct Run {
  int count = 0, first = -1, last = -1;
};
Run run_of(const PlotImage& img, const PlotImage::Rect& row, uint32_t c, int dy = -3) {
  Run r;
  const int y = (row.y0 + row.y1) / 2 + dy;
  for (int x = row.x0; x < row.x1; ++x)
    if (is(img.pixel(x, y), c)) {
      ++r.count;
      if (r.first < 0) r.first = x;
      r.last = x;
    }
  return r;
}

int pixels_of(const PlotImage& img, const PlotImage::Rect& r, uint32_t c) {
  int n = 0;
  for (int y = r.y0; y < r.y1; ++y)
    for (int x = r.x0; x < r.x1; ++x) n += is(img.pixel(x, y), c);
  return n;
}

}  // namespace

TEST_CASE("bar chart: ratios on a log axis, whiskers, markers and notes", "[utils]") {
  const BarChartOptions opt = BarChartOptions().log_x(true).origin(1).marker_label("claimed").whisker_label("spread");
  const std::vector<Bar> bars = {
      {"two", 2.0},
      {"four", 4.0, 3.0, 5.0},
      {"half", 0.5, NAN, NAN, 2.0},
      {"none", NAN, NAN, NAN, NAN, "needs a GPU"},
  };
  const PlotImage img = render_bar_chart("ratios", bars, opt);
  REQUIRE(img.panels.size() == 1 + bars.size());  // the plot area, then one rect per bar
  const auto &two = img.panels[1], &four = img.panels[2], &half = img.panels[3], &none = img.panels[4];

  const Run r2 = run_of(img, two, opt.color()), r4 = run_of(img, four, opt.color());
  const Run rh = run_of(img, half, opt.below_color());
  REQUIRE(r2.count > 10);
  // log axis: 4x is twice as far from 1x as 2x, and 0.5x as far as 2x, on the other side
  CHECK(std::abs((r4.last - r4.first) - 2 * (r2.last - r2.first)) <= 2);
  CHECK(std::abs((rh.last - rh.first) - (r2.last - r2.first)) <= 2);
  CHECK(std::abs(rh.last - r2.first) <= 2);  // both start at the origin (its line lies between)
  CHECK(run_of(img, half, opt.color()).count == 0);
  CHECK(run_of(img, two, opt.below_color()).count == 0);

  // the whisker runs 3x..5x along the centre line: past the bar's end (4x)
  const Run w4 = run_of(img, four, opt.whisker_color(), 0);
  CHECK(w4.last > r4.last + 5);
  CHECK(pixels_of(img, two, opt.whisker_color()) == 0);
  // a marker only where one was given; at 2x it sits where the "two" bar ends
  CHECK(pixels_of(img, two, opt.marker_color()) == 0);
  const Run m = run_of(img, half, opt.marker_color());
  REQUIRE(m.count > 0);
  CHECK(std::abs((m.first + m.last) / 2 - r2.last) <= 2);
  // no value: no bar, but the note's text
  CHECK(run_of(img, none, opt.color()).count == 0);
  CHECK(run_of(img, none, opt.below_color()).count == 0);
  CHECK(pixels_of(img, none, 0x969696) > 50);  // the note, in the muted text colour
  CHECK(pixels_of(img, two, 0x969696) == 0);

  const auto dir = kiln_test::fresh_dir("bar-chart");
  write_bar_chart_png((dir / "bars.png").string(), "ratios", bars, opt);
  const std::string png = kiln_test::slurp(dir / "bars.png");
  REQUIRE(png.size() > 100);
  CHECK(png.substr(1, 3) == "PNG");
  std::filesystem::remove_all(dir);
}

TEST_CASE("bar chart edge cases and errors", "[utils]") {
  // no bars: one empty plot, still a valid image
  const PlotImage empty = render_bar_chart("", {});
  CHECK(empty.width == 1000);
  CHECK(empty.panels.size() == 1);
  // a linear axis from 0; negative values go left in the below colour
  const BarChartOptions lin;
  const PlotImage img = render_bar_chart("t", {{"up", 3}, {"down", -3}}, lin);
  const Run up = run_of(img, img.panels[1], lin.color()), down = run_of(img, img.panels[2], lin.below_color());
  CHECK(std::abs((up.last - up.first) - (down.last - down.first)) <= 2);
  CHECK(down.last <= up.first + 1);
  // long labels are cut to fit, never overflow the image
  CHECK_NOTHROW(render_bar_chart("t", {{std::string(400, 'x'), 1.5}}, BarChartOptions().log_x(true).origin(1)));
  CHECK_THROWS_WITH(render_bar_chart("t", {}, BarChartOptions().log_x(true).origin(0)), Catch::Contains("origin"));
  CHECK_THROWS_WITH(render_bar_chart("t", {}, BarChartOptions().width(50)), Catch::Contains("width"));
  CHECK_THROWS_WITH(write_bar_chart_png("/nonexistent-dir/x.png", "t", {{"a", 1}}), Catch::Contains("x.png"));
}
