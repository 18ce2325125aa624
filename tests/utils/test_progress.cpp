// Progress with an injected clock, written to an ostringstream, in both display modes.
#include <algorithm>
#include <catch2/catch.hpp>
#include <sstream>
#include <string>

#include "kiln/utils/progress.h"

using namespace kiln::utils;

namespace {
int count(const std::string& s, char c) { return int(std::count(s.begin(), s.end(), c)); }
std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}
}  // namespace

TEST_CASE("format_duration", "[utils]") {
  CHECK(format_duration(0) == "0:00");
  CHECK(format_duration(65.4) == "1:05");
  CHECK(format_duration(3723) == "1:02:03");
  CHECK(format_duration(-1) == "?");
  CHECK(format_duration(NAN) == "?");
}

TEST_CASE("Progress on a terminal redraws one line", "[utils]") {
  std::ostringstream os;
  double t = 0;
  {
    Progress p(100, "epoch 1/2", os, /*is_tty=*/true,
               ProgressOptions().redraw_seconds(0).max_width(0).bar_width(10).clock([&] { return t; }));
    for (int s = 1; s <= 100; ++s) {
      t += 0.5;
      p.update(s, {{"loss", 0.42}, {"lr", 0.003}}, 1523.4);
      if (s == 50) {
        const std::string mid = os.str();
        CHECK(count(mid, '\n') == 0);
        const std::string last = mid.substr(mid.rfind('\r') + 1);
        CHECK(last == "epoch 1/2 [#####.....] 50/100  loss 0.42  lr 0.003  1523 samples/s  ETA 0:25");
      }
    }
    CHECK(count(os.str(), '\r') == 100);
    p.finish();
    CHECK(p.lines_written() == 1);
  }
  const std::string out = os.str();
  CHECK(count(out, '\n') == 1);
  CHECK(out.back() == '\n');
  const std::string last = out.substr(out.rfind('\r') + 1);
  CHECK(last == "epoch 1/2 [##########] 100/100  loss 0.42  lr 0.003  1523 samples/s  done in 0:50\n");
}

TEST_CASE("Progress on a terminal: throttled redraws, shorter lines wipe longer ones", "[utils]") {
  std::ostringstream os;
  double t = 0;
  Progress p(10, "", os, true, ProgressOptions().max_width(0).clock([&] { return t; }));
  p.update(1, {{"loss", 1.23456789}}, 12.34);  // drawn (first)
  p.update(2, {{"loss", 1.0}});                // same instant: skipped
  CHECK(count(os.str(), '\r') == 1);
  t = 1;
  p.update(3, {{"loss", 1.0}});  // drawn, shorter than the first
  const std::string s = os.str();
  CHECK(count(s, '\r') == 2);
  const std::string first = s.substr(1, s.rfind('\r') - 1);
  const std::string second = s.substr(s.rfind('\r') + 1);
  CHECK(first.find("loss 1.235  12.3 samples/s") != std::string::npos);
  CHECK(second.size() == first.size());  // padded with spaces
  CHECK(second.back() == ' ');
  p.update(10, {});  // the last step is always drawn
  CHECK(count(os.str(), '\r') == 3);
  p.finish();
  CHECK(os.str().back() == '\n');
}

TEST_CASE("Progress off a terminal writes a line per 10% and a final one", "[utils]") {
  std::ostringstream os;
  double t = 0;
  {
    Progress p(1000, "epoch 1/2", os, /*is_tty=*/false, ProgressOptions().clock([&] { return t; }));
    for (int s = 1; s <= 1000; ++s) {
      t += 0.001;
      p.update(s, {{"loss", 1.0 / s}}, 2000);
    }
    // the destructor finishes
  }
  const std::string out = os.str();
  CHECK(count(out, '\r') == 0);
  const auto lines = lines_of(out);
  REQUIRE(lines.size() == 10);
  CHECK(lines[0] == "epoch 1/2  100/1000 (10%)  loss 0.01  2000 samples/s  ETA 0:01");
  CHECK(lines[8].find("900/1000 (90%)") != std::string::npos);
  CHECK(lines[9] == "epoch 1/2  1000/1000 (100%)  loss 0.001  2000 samples/s  done in 0:01");
}

TEST_CASE("Progress off a terminal: time-based lines, at most max_lines per epoch", "[utils]") {
  std::ostringstream os;
  double t = 0;
  Progress p(1000, "slow", os, false, ProgressOptions().clock([&] { return t; }));
  int after_first_10s = -1;
  for (int s = 1; s <= 1000; ++s) {
    t += 1.0;  // a 1000 s epoch: a line every 10 s would make 100
    p.update(s, {{"loss", 0.5}});
    if (s == 11) after_first_10s = int(p.lines_written());
  }
  p.finish();
  CHECK(after_first_10s == 1);  // a line came after 10 s, long before the 10% mark
  CHECK(p.lines_written() <= 20);
  CHECK(p.lines_written() >= 15);
  const auto lines = lines_of(os.str());
  CHECK(int(lines.size()) == p.lines_written());
  // every percentage mark still got its line
  for (int pct = 10; pct <= 90; pct += 10) {
    const std::string mark = "(" + std::to_string(pct) + "%)";
    CHECK(std::any_of(lines.begin(), lines.end(),
                      [&](const std::string& l) { return l.find(mark) != std::string::npos; }));
  }
}

TEST_CASE("Progress with an unknown total", "[utils]") {
  std::ostringstream os;
  double t = 0;
  Progress p(0, "eval", os, false, ProgressOptions().clock([&] { return t; }));
  for (int s = 1; s <= 25; ++s) {
    t += 1;
    p.update(s, {{"acc", 0.5}});
  }
  p.finish({{"acc", 0.9}});
  const auto lines = lines_of(os.str());
  REQUIRE(lines.size() == 3);  // at 10 s, 20 s, and the end (25 s)
  CHECK(lines[0] == "eval  step 10  acc 0.5");
  CHECK(lines[2] == "eval  step 25  acc 0.9  done in 0:25");
}
