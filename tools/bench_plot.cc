#include "tools/bench_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <map>

namespace rdmabuf::tool {
namespace {

// Okabe-Ito first (colour-blind safe), then Paul Tol's muted colours for plots with more
// labels; yellow is darkened so that it reads on white. Labels beyond these reuse them.
constexpr const char* kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                    "#E69F00", "#56B4E9", "#000000", "#882255",
                                    "#999933", "#44AA99", "#AA4499", "#B8A000"};
constexpr size_t kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

// Layout, in px of the document's own coordinates.
constexpr double kMinWidth = 1000, kMinPanelWidth = 340, kMargin = 16;
constexpr double kPanelTop = 96, kPlotHeight = 360, kAxisLeft = 64, kAxisRight = 16;
constexpr double kInset = 10;           // between the frame and the first/last size
constexpr double kMinTickSpacing = 50;  // between labelled size ticks, room for "256 KiB"
constexpr double kLegendRow = 22, kLegendFont = 12;

// `value` with `precision` digits after the point ("%.*f"), or significant digits ("%.*g":
// "0.01", "10", "1.23") when `significant`; always '.' as the point, whatever LC_NUMERIC says.
std::string num(double value, int precision = 1, bool significant = false) {
  char buffer[64];
  if (significant) {
    std::snprintf(buffer, sizeof buffer, "%.*g", precision, value);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.*f", precision, value);
  }
  std::string text(buffer);
  std::replace(text.begin(), text.end(), ',', '.');
  return text;
}

// `text` safe inside XML text and attribute values; control characters XML forbids are dropped.
std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
    }
  }
  return out;
}

// Rough rendered width of `text` at `font_size`: code points times an average glyph width.
double text_width(const std::string& text, double font_size) {
  size_t code_points = std::count_if(
      text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) >> 6) != 2; });
  return 0.55 * font_size * static_cast<double>(code_points);
}

// "4 KiB", "1 MiB" … for 2^log2_bytes, 0 <= log2_bytes <= 64.
std::string size_label(int log2_bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = std::min(log2_bytes / 10, 6);
  return std::to_string(uint64_t{1} << (log2_bytes - 10 * unit)) + " " + kUnits[unit];
}

bool usable(const std::pair<uint64_t, double>& point) {
  return point.first > 0 && std::isfinite(point.second) && point.second > 0;
}

// The shared axes: x over [2^x_lo, 2^x_hi] bytes, y over [10^y_lo, 10^y_hi] GB/s; lo < hi.
struct Axes {
  int x_lo = 12, x_hi = 26, y_lo = -1, y_hi = 1;
};

Axes axes_for(const std::vector<PlotPanel>& panels) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double x_min = kInf, x_max = -kInf, y_min = kInf, y_max = -kInf;
  for (const PlotPanel& panel : panels) {
    for (const PlotSeries& series : panel.series) {
      for (const auto& point : series.points) {
        if (!usable(point)) continue;
        x_min = std::min(x_min, std::log2(static_cast<double>(point.first)));
        x_max = std::max(x_max, std::log2(static_cast<double>(point.first)));
        y_min = std::min(y_min, std::log10(point.second));
        y_max = std::max(y_max, std::log10(point.second));
      }
    }
  }
  Axes axes;
  if (x_min > x_max) return axes;
  // The epsilon keeps exact powers (1024, 10 GB/s) from rounding out to the next tick.
  axes.x_lo = static_cast<int>(std::floor(x_min + 1e-9));
  axes.x_hi = static_cast<int>(std::ceil(x_max - 1e-9));
  if (axes.x_lo == axes.x_hi) axes.x_lo = std::max(0, axes.x_lo - 1), axes.x_hi += 1;
  axes.y_lo = static_cast<int>(std::floor(y_min + 1e-9));
  axes.y_hi = static_cast<int>(std::ceil(y_max - 1e-9));
  if (axes.y_lo == axes.y_hi) axes.y_hi += 1;
  return axes;
}

// Where a plot sits on the page, and the mapping from data to page coordinates.
struct Frame {
  double left, top, width, height;
  Axes axes;
  double x(double log2_bytes) const {
    return left + kInset +
           (width - 2 * kInset) * (log2_bytes - axes.x_lo) / (axes.x_hi - axes.x_lo);
  }
  double y(double log10_gbps) const {
    return top + height * (axes.y_hi - log10_gbps) / (axes.y_hi - axes.y_lo);
  }
};

void add_line(std::string& svg, double x1, double y1, double x2, double y2, const char* style) {
  svg += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" +
         num(y2) + "\" " + style + "/>\n";
}

void add_text(std::string& svg, double x, double y, const std::string& attributes,
              const std::string& text) {
  svg += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" " + attributes + ">" + escape(text) +
         "</text>\n";
}

// The line style of a series (or of its legend sample) in `colour`.
std::string stroke_style(bool rdmabuf, const char* colour) {
  return std::string("stroke=\"") + colour + "\" stroke-width=\"" + (rdmabuf ? "2.5" : "1.5") +
         (rdmabuf ? "\"" : "\" stroke-dasharray=\"6 4\"");
}

void add_marker(std::string& svg, double x, double y, bool rdmabuf, const char* colour,
                const std::string& tooltip) {
  svg += "<circle cx=\"" + num(x) + "\" cy=\"" + num(y) + "\" r=\"" + (rdmabuf ? "4" : "3.5") +
         "\" fill=\"" + (rdmabuf ? colour : "#ffffff") + "\" stroke=\"" + colour +
         "\" stroke-width=\"1.5\"><title>" + escape(tooltip) + "</title></circle>\n";
}

void add_panel(std::string& svg, const PlotPanel& panel, const Frame& frame,
               const std::map<std::string, size_t>& colour_index) {
  const double right = frame.left + frame.width, bottom = frame.top + frame.height;
  const std::string tick_font = "font-size=\"11\" fill=\"#333333\"";
  add_text(svg, frame.left + frame.width / 2, frame.top - 10,
           "font-size=\"15\" font-weight=\"bold\" text-anchor=\"middle\"", panel.title);
  svg += "<rect x=\"" + num(frame.left) + "\" y=\"" + num(frame.top) + "\" width=\"" +
         num(frame.width) + "\" height=\"" + num(frame.height) +
         "\" fill=\"#ffffff\" stroke=\"#888888\"/>\n";
  const bool minor_grid = frame.axes.y_hi - frame.axes.y_lo <= 4;
  for (int decade = frame.axes.y_lo; decade <= frame.axes.y_hi; ++decade) {
    add_line(svg, frame.left, frame.y(decade), right, frame.y(decade), "stroke=\"#bbbbbb\"");
    add_text(svg, frame.left - 6, frame.y(decade) + 4, tick_font + " text-anchor=\"end\"",
             num(std::pow(10.0, decade), 6, true));
    for (int m = 2; minor_grid && decade < frame.axes.y_hi && m <= 9; ++m) {
      double y = frame.y(decade + std::log10(m));
      add_line(svg, frame.left, y, right, y, "stroke=\"#eeeeee\"");
    }
  }
  // Label every step-th power of two, step itself a power of two, keeping labels apart.
  const int span = frame.axes.x_hi - frame.axes.x_lo;
  int step = 1;
  while (step < span && (frame.width - 2 * kInset) * step / span < kMinTickSpacing)
    step *= 2;
  for (int e = frame.axes.x_lo; e <= frame.axes.x_hi; ++e) {
    const bool labelled = e % step == 0;
    add_line(svg, frame.x(e), frame.top, frame.x(e), bottom,
             labelled ? "stroke=\"#cccccc\"" : "stroke=\"#f0f0f0\"");
    if (labelled) {
      add_text(svg, frame.x(e), bottom + 16, tick_font + " text-anchor=\"middle\"", size_label(e));
    }
  }
  add_text(svg, frame.left + frame.width / 2, bottom + 36,
           "font-size=\"12\" text-anchor=\"middle\"", "transfer size");
  svg += "<text transform=\"translate(" + num(frame.left - 44) + "," +
         num(frame.top + frame.height / 2) +
         ") rotate(-90)\" font-size=\"12\" text-anchor=\"middle\">GB/s</text>\n";
  // Peers first, so that rdmabuf's lines are drawn on top.
  for (bool rdmabuf_pass : {false, true}) {
    for (const PlotSeries& series : panel.series) {
      if (series.rdmabuf != rdmabuf_pass) continue;
      std::vector<std::pair<uint64_t, double>> points;
      std::copy_if(series.points.begin(), series.points.end(), std::back_inserter(points), usable);
      std::sort(points.begin(), points.end());
      const char* colour = kPalette[colour_index.at(series.label) % kPaletteSize];
      std::string coordinates;
      for (const auto& [bytes, gbps] : points) {
        coordinates += num(frame.x(std::log2(static_cast<double>(bytes)))) + "," +
                       num(frame.y(std::log10(gbps))) + " ";
      }
      if (points.size() >= 2) {
        svg += "<polyline fill=\"none\" stroke-linejoin=\"round\" " +
               stroke_style(series.rdmabuf, colour) + " points=\"" + coordinates + "\"/>\n";
      }
      for (const auto& [bytes, gbps] : points) {
        add_marker(
            svg, frame.x(std::log2(static_cast<double>(bytes))), frame.y(std::log10(gbps)),
            series.rdmabuf, colour,
            series.label + ": " + std::to_string(bytes) + " B, " + num(gbps, 4, true) + " GB/s");
      }
    }
  }
}

}  // namespace

std::string render_bandwidth_svg(const std::string& title, const std::string& subtitle,
                                 const std::vector<PlotPanel>& panels) {
  // Colours by order of first appearance; the legend follows the same order.
  std::map<std::string, size_t> colour_index;
  std::vector<const PlotSeries*> legend;
  for (const PlotPanel& panel : panels) {
    for (const PlotSeries& series : panel.series) {
      if (colour_index.emplace(series.label, legend.size()).second) legend.push_back(&series);
    }
  }
  const size_t panel_count = std::max<size_t>(panels.size(), 1);
  const double width = std::max(kMinWidth, kMinPanelWidth * static_cast<double>(panel_count));
  const double slot = (width - 2 * kMargin) / static_cast<double>(panel_count);
  const Axes axes = axes_for(panels);
  std::string body;
  for (size_t i = 0; i < panels.size(); ++i) {
    Frame frame{kMargin + slot * static_cast<double>(i) + kAxisLeft, kPanelTop,
                slot - kAxisLeft - kAxisRight, kPlotHeight, axes};
    add_panel(body, panels[i], frame, colour_index);
  }
  // Legend entries flow left to right, wrapping into rows under the panels.
  const double legend_left = kMargin + kAxisLeft, legend_top = kPanelTop + kPlotHeight + 66;
  double x = legend_left, y = legend_top;
  for (const PlotSeries* series : legend) {
    const double entry_width = 36 + text_width(series->label, kLegendFont) + 24;
    if (x > legend_left && x + entry_width > width - kMargin) x = legend_left, y += kLegendRow;
    const char* colour = kPalette[colour_index.at(series->label) % kPaletteSize];
    body += "<line x1=\"" + num(x) + "\" y1=\"" + num(y - 4) + "\" x2=\"" + num(x + 28) +
            "\" y2=\"" + num(y - 4) + "\" " + stroke_style(series->rdmabuf, colour) + "/>\n";
    add_marker(body, x + 14, y - 4, series->rdmabuf, colour, series->label);
    add_text(body, x + 36, y, "font-size=\"12\"", series->label);
    x += entry_width;
  }
  const double height = (legend.empty() ? legend_top - kLegendRow : y) + kLegendRow;
  std::string svg =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
      num(width, 0) + "\" height=\"" + num(height, 0) + "\" viewBox=\"0 0 " + num(width, 0) + " " +
      num(height, 0) +
      "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  add_text(svg, width / 2, 32, "font-size=\"20\" font-weight=\"bold\" text-anchor=\"middle\"",
           title);
  add_text(svg, width / 2, 54, "font-size=\"13\" fill=\"#555555\" text-anchor=\"middle\"",
           subtitle);
  return svg + body + "</svg>\n";
}

}  // namespace rdmabuf::tool
