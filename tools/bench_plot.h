// SVG plots of `rdmabuf bench` results: bandwidth against transfer size,
// rdmabuf's own lines beside the peers measured in the same run.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rdmabuf::tool {

// One line of the plot: bandwidth (GB/s, 1e9 bytes/s) against transfer size (bytes).
struct PlotSeries {
  std::string label;     // e.g. "rdmabuf tcp", "iperf3 -P 2", "UCX shm"
  bool rdmabuf = false;  // rdmabuf's own lines: solid and thicker; peers: dashed
  // (size in bytes, GB/s); any order. Points with size 0 or GB/s <= 0 (or not finite) are skipped.
  std::vector<std::pair<uint64_t, double>> points;
};

// One panel: e.g. "read (get)" or "write (put)".
struct PlotPanel {
  std::string title;
  std::vector<PlotSeries> series;
};

// A standalone SVG document (UTF-8; no external fonts, scripts or CSS): the panels side by side,
// sharing one log2 size axis (ticks "4 KiB", "64 KiB", "1 MiB" …) and one log10 GB/s axis
// (decade gridlines 0.01, 0.1, 1, 10 …, the data's range widened to whole decades), one polyline
// with point markers per series, and a shared legend below: one entry per distinct label in order
// of first appearance, each label keeping its colour in every panel. `title` heads the page and
// `subtitle` (machine, date) follows in smaller text. All text is XML-escaped. Panels without
// usable points still get their axes (over 4 KiB..64 MiB and 0.1..10 GB/s when no panel has
// data). The output depends only on the arguments, not on the C locale.
std::string render_bandwidth_svg(const std::string& title, const std::string& subtitle,
                                 const std::vector<PlotPanel>& panels);

}  // namespace rdmabuf::tool
