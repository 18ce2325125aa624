#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "kiln/utils/csv.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace kiln::utils;
using kiln_test::fresh_dir;
using kiln_test::slurp;

TEST_CASE("format_double is short and exact", "[utils]") {
  CHECK(format_double(0.1) == "0.1");
  CHECK(format_double(3.0) == "3");
  CHECK(format_double(-2.5e-7) == "-2.5e-07");
  CHECK(format_double(std::numeric_limits<double>::quiet_NaN()) == "nan");
  CHECK(format_double(-INFINITY) == "-inf");
  for (double v : {1.0 / 3, 2.0 / 3e10, 0.30000000000000004, 1e-300, 123456789.123456789})
    CHECK(std::stod(format_double(v)) == v);
}

TEST_CASE("csv_quote quotes only when needed", "[utils]") {
  CHECK(csv_quote("loss") == "loss");
  CHECK(csv_quote("a,b") == "\"a,b\"");
  CHECK(csv_quote("say \"hi\"") == "\"say \"\"hi\"\"\"");
  CHECK(csv_quote("two\nlines") == "\"two\nlines\"");
  CHECK(csv_quote(" padded") == "\" padded\"");
}

TEST_CASE("CsvWriter round trip, flushed per row, append on resume", "[utils]") {
  const fs::path dir = fresh_dir("csv");
  const std::string path = (dir / "metrics.csv").string();
  const std::vector<std::string> cols = {"epoch", "step", "loss", "note, with comma"};
  {
    CsvWriter w(path, cols);
    w.write_row({1, int64_t(469), 0.1, "plain"});
    // visible before close: each row is flushed
    CHECK(slurp(path) == "epoch,step,loss,\"note, with comma\"\n1,469,0.1,plain\n");
    w.write_row({2, 938, 1.0 / 3, "has,comma"});
    w.write_row({3, 1407, std::numeric_limits<double>::quiet_NaN(), "quote \"q\""});
    w.write_row({CsvCell(), 1876, 2.5f, "multi\nline"});
    w.write_row({5, 2345, true, std::string("")});
    CHECK(w.rows_written() == 5);
    CHECK_THROWS_WITH(w.write_row({1, 2}), Catch::Contains("2 cells for 4 columns") && Catch::Contains("metrics.csv"));
  }
  auto rows = read_csv(path);
  REQUIRE(rows.size() == 6);
  CHECK(rows[0] == cols);
  CHECK(rows[1] == std::vector<std::string>{"1", "469", "0.1", "plain"});
  CHECK(std::stod(rows[2][2]) == 1.0 / 3);
  CHECK(rows[2][3] == "has,comma");
  CHECK(rows[3][2] == "nan");
  CHECK(rows[3][3] == "quote \"q\"");
  CHECK(rows[4] == std::vector<std::string>{"", "1876", "2.5", "multi\nline"});
  CHECK(rows[5] == std::vector<std::string>{"5", "2345", "true", ""});

  {  // a resumed run appends under the same header
    CsvWriter w(path, cols, /*append=*/true);
    CHECK(w.rows_written() == 5);
    w.write_row({6, 2814, 0.05, "resumed"});
  }
  rows = read_csv(path);
  REQUIRE(rows.size() == 7);
  CHECK(rows[6][3] == "resumed");
  CHECK_THROWS_WITH(CsvWriter(path, {"epoch", "other"}, true),
                    Catch::Contains("different header") && Catch::Contains("metrics.csv"));
  {  // without append the file starts over
    CsvWriter w(path, {"only"});
    w.write_row({CsvCell()});
  }
  CHECK(read_csv(path) == std::vector<std::vector<std::string>>{{"only"}, {""}});
  CHECK_THROWS_WITH(CsvWriter((dir / "no" / "such" / "dir.csv").string(), cols), Catch::Contains("dir.csv"));
  fs::remove_all(dir);
}

TEST_CASE("parse_csv handles CRLF and a missing final newline", "[utils]") {
  const auto rows = parse_csv("a,b\r\n1,\"x\r\ny\"\r\n2,3");
  REQUIRE(rows.size() == 3);
  CHECK(rows[1][1] == "x\r\ny");
  CHECK(rows[2] == std::vector<std::string>{"2", "3"});
  CHECK_THROWS_WITH(parse_csv("a,\"b\n"), Catch::Contains("unterminated"));
}
