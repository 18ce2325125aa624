#pragma once
// CsvWriter: a metrics table (metrics.csv) written one row at a time, each row flushed so the
// file is complete if the run stops. RFC 4180 quoting: a cell holding a comma, a quote, CR or LF
// (or leading/trailing spaces) is wrapped in double quotes, with inner quotes doubled. Numbers
// are written in the shortest form that reads back to the same double; NaN and infinities as
// nan, inf, -inf; an empty cell (CsvCell{}) as nothing (a missing value).
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

namespace kiln::utils {

// Shortest "%.{p}g" text (p <= 17) that parses back to exactly `v`.
std::string format_double(double v);
// `s` quoted for CSV when it needs it, otherwise unchanged.
std::string csv_quote(const std::string& s);

// One cell: a number, a string, or empty.
class CsvCell {
 public:
  CsvCell() = default;
  template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  CsvCell(T v) {  // NOLINT: implicit on purpose, so rows read {epoch, loss, "note"}
    if constexpr (std::is_same_v<T, bool>) {
      text_ = v ? "true" : "false";
    } else if constexpr (std::is_integral_v<T>) {
      text_ = std::to_string(v);
    } else {
      text_ = format_double(static_cast<double>(v));
    }
  }
  CsvCell(const char* s) : text_(csv_quote(s)) {}         // NOLINT
  CsvCell(const std::string& s) : text_(csv_quote(s)) {}  // NOLINT
  const std::string& text() const { return text_; }       // already quoted

 private:
  std::string text_;
};

class CsvWriter {
 public:
  // Opens `path` (its folder must exist) and writes the header row. With append = true and an
  // existing non-empty file whose header equals `columns`, rows are appended to it instead (a
  // resumed run continues its metrics.csv); a different header is an error naming the path.
  CsvWriter(const std::string& path, std::vector<std::string> columns, bool append = false);
  ~CsvWriter();
  CsvWriter(const CsvWriter&) = delete;
  CsvWriter& operator=(const CsvWriter&) = delete;

  // One row, exactly one cell per column; written and flushed at once.
  void write_row(const std::vector<CsvCell>& row);
  void close();

  const std::string& path() const { return path_; }
  const std::vector<std::string>& columns() const { return columns_; }
  int64_t rows_written() const { return rows_; }

 private:
  void write_line(const std::string& line);

  std::string path_;
  std::vector<std::string> columns_;
  std::FILE* file_ = nullptr;
  int64_t rows_ = 0;
};

// Parses CSV text (RFC 4180: quoted cells may hold commas, doubled quotes and newlines; CRLF or
// LF line ends) into rows of unquoted cells. read_csv reads a file; errors name the path.
std::vector<std::vector<std::string>> parse_csv(const std::string& text);
std::vector<std::vector<std::string>> read_csv(const std::string& path);

}  // namespace kiln::utils
