#include "kiln/utils/csv.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "kiln/core/error.h"

namespace kiln::utils {

std::string format_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  for (int p = 6; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string csv_quote(const std::string& s) {
  const bool needs =
      s.find_first_of(",\"\r\n") != std::string::npos || (!s.empty() && (s.front() == ' ' || s.back() == ' '));
  if (!needs) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

namespace {
std::string header_line(const std::vector<std::string>& columns) {
  std::string line;
  for (size_t i = 0; i < columns.size(); ++i) line += (i ? "," : "") + csv_quote(columns[i]);
  return line;
}
}  // namespace

CsvWriter::CsvWriter(const std::string& path, std::vector<std::string> columns, bool append)
    : path_(path), columns_(std::move(columns)) {
  KILN_CHECK(!columns_.empty(), "CsvWriter: no columns for '", path, "'");
  bool write_header = true;
  if (append) {
    std::ifstream in(path, std::ios::binary);
    if (in && in.peek() != std::ifstream::traits_type::eof()) {
      std::stringstream ss;
      ss << in.rdbuf();
      const auto rows = parse_csv(ss.str());
      KILN_CHECK(!rows.empty() && rows.front() == columns_, "CsvWriter: '", path,
                 "' exists with a different header (expected ", header_line(columns_), "); refusing to append");
      write_header = false;
      rows_ = static_cast<int64_t>(rows.size()) - 1;
      // a file cut off mid-row (no trailing newline) gets its line ended first
      std::string s = ss.str();
      if (!s.empty() && s.back() != '\n') {
        file_ = std::fopen(path.c_str(), "ab");
        KILN_CHECK(file_ != nullptr, "CsvWriter: cannot open '", path, "': ", std::strerror(errno));
        write_line("");
      }
    }
  }
  if (file_ == nullptr) {
    file_ = std::fopen(path.c_str(), write_header ? "wb" : "ab");
    KILN_CHECK(file_ != nullptr, "CsvWriter: cannot open '", path, "' for writing: ", std::strerror(errno));
  }
  if (write_header) write_line(header_line(columns_));
}

CsvWriter::~CsvWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void CsvWriter::write_line(const std::string& line) {
  KILN_CHECK(file_ != nullptr, "CsvWriter: write after close ('", path_, "')");
  const std::string s = line + "\n";
  KILN_CHECK(std::fwrite(s.data(), 1, s.size(), file_) == s.size() && std::fflush(file_) == 0,
             "CsvWriter: cannot write to '", path_, "': ", std::strerror(errno));
}

void CsvWriter::write_row(const std::vector<CsvCell>& row) {
  KILN_CHECK(row.size() == columns_.size(), "CsvWriter::write_row: ", row.size(), " cells for ", columns_.size(),
             " columns (", header_line(columns_), ") in '", path_, "'");
  std::string line;
  for (size_t i = 0; i < row.size(); ++i) {
    if (i) line += ',';
    line += row[i].text();
  }
  if (line.empty()) line = "\"\"";  // one empty cell: keep the row from reading as a blank line
  write_line(line);
  ++rows_;
}

void CsvWriter::close() {
  if (file_ == nullptr) return;
  const bool ok = std::fclose(file_) == 0;
  file_ = nullptr;
  KILN_CHECK(ok, "CsvWriter: cannot close '", path_, "'");
}

std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string cell;
  bool quoted = false, row_has_content = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"') {
        if (i + 1 < text.size() && text[i + 1] == '"') {
          cell += '"';
          ++i;
        } else {
          quoted = false;
        }
      } else {
        cell += c;
      }
      continue;
    }
    if (c == '"') {
      quoted = true;
      row_has_content = true;
    } else if (c == ',') {
      row.push_back(std::move(cell));
      cell.clear();
      row_has_content = true;
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      if (row_has_content || !cell.empty()) {
        row.push_back(std::move(cell));
        rows.push_back(std::move(row));
      }
      row.clear();
      cell.clear();
      row_has_content = false;
    } else {
      cell += c;
      row_has_content = true;
    }
  }
  KILN_CHECK(!quoted, "parse_csv: unterminated quoted cell");
  if (row_has_content || !cell.empty()) {
    row.push_back(std::move(cell));
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "read_csv: cannot open '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return parse_csv(ss.str());
  } catch (const kiln::Error& e) {
    KILN_FAIL(e.what(), " in '", path, "'");
  }
}

}  // namespace kiln::utils
