#include "tools/bench_report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <set>
#include <tuple>

#include "common/strings.h"

namespace rdmabuf::tool {
namespace {

constexpr std::string_view kRdmabufPrefix = "rdmabuf ";

bool is_rdmabuf(const Figure& f) {
  return f.system.rfind(kRdmabufPrefix, 0) == 0;
}

double median_value(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// `value` with `decimals` digits after the point.
std::string fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string human_rate(double ops) {
  if (ops >= 1e6) return fixed(ops / 1e6, 2) + "M";
  if (ops >= 1e3) return fixed(ops / 1e3, 1) + "k";
  return fixed(ops, 0);
}

// A headline figure as the table prints it.
std::string format_headline(const std::string& kind, double value) {
  if (kind == "bandwidth") return fixed(value, 3);
  if (kind == "rate") return human_rate(value);
  return fixed(value, value >= 100 ? 0 : value >= 1 ? 1 : 3);  // microseconds
}

std::string pad(std::string text, size_t width) {
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text;
}

std::string pad_left(std::string text, size_t width) {
  if (text.size() < width) text.insert(0, width - text.size(), ' ');
  return text;
}

const Comparison* find_comparison(const std::vector<Comparison>& comparisons,
                                  const std::string& backend, const std::string& peer,
                                  const Figure& f) {
  for (const Comparison& c : comparisons) {
    if (c.backend == backend && c.peer == peer && c.kind == f.kind && c.op == f.op &&
        c.size == f.size) {
      return &c;
    }
  }
  return nullptr;
}

const char* kind_heading(const std::string& kind) {
  if (kind == "bandwidth") {
    return "bandwidth, GB/s: a window of ops on one range, the shape the peers measure\n"
           "(spread: rdmabuf with the window over distinct ranges, as real data lies)";
  }
  if (kind == "latency") return "one op, round trip, p50 us (rdmabuf's p99 in brackets)";
  return "small ops submitted as one batch, ops/s";
}

std::string json_number(double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", value);
  return buf;
}

}  // namespace

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

double headline(const Figure& f) {
  if (f.kind == "bandwidth") return f.gbps;
  if (f.kind == "rate") return f.ops_per_s;
  return f.p50_us;
}

std::vector<Figure> median_of_runs(const std::vector<Figure>& runs) {
  using Key = std::tuple<std::string, std::string, std::string, uint64_t>;
  std::vector<Key> order;
  std::map<Key, std::vector<const Figure*>> groups;
  for (const Figure& f : runs) {
    Key key{f.system, f.kind, f.op, f.size};
    auto [it, fresh] = groups.try_emplace(key);
    if (fresh) order.push_back(key);
    it->second.push_back(&f);
  }
  std::vector<Figure> out;
  for (const Key& key : order) {
    const auto& group = groups[key];
    auto med = [&group](double Figure::*field) {
      std::vector<double> v;
      for (const Figure* f : group)
        v.push_back(f->*field);
      return median_value(v);
    };
    Figure m = *group.front();
    m.gbps = med(&Figure::gbps);
    m.p50_us = med(&Figure::p50_us);
    m.p99_us = med(&Figure::p99_us);
    m.ops_per_s = med(&Figure::ops_per_s);
    m.runs = static_cast<int>(group.size());
    out.push_back(m);
  }
  return out;
}

std::map<std::string, std::vector<std::string>> peers_by_backend(int tcp_streams,
                                                                 const std::string& perftest) {
  return {
      {"tcp", {"iperf3 -P " + std::to_string(tcp_streams), "qperf", "UCX tcp"}},
      {"memory", {"UCX shm", "memcpy"}},
      {"ibverbs", {perftest}},
  };
}

std::vector<Comparison> compare(const std::vector<Figure>& figures,
                                const std::map<std::string, std::vector<std::string>>& peers) {
  std::vector<Comparison> out;
  for (const Figure& f : figures) {
    if (!is_rdmabuf(f) || f.kind == "setup" || headline(f) <= 0) continue;
    const std::string backend = f.system.substr(kRdmabufPrefix.size());
    auto listed = peers.find(backend);
    if (listed == peers.end()) continue;
    for (const std::string& peer : listed->second) {
      for (const Figure& g : figures) {
        if (g.system != peer || g.kind != f.kind || g.size != f.size) continue;
        if (g.op != f.op && g.op != "stream") continue;
        if (headline(g) <= 0) continue;
        Comparison c{backend, peer, f.kind, f.op, f.size, headline(f), headline(g), 0};
        c.speedup = f.kind == "latency" ? c.peer_figure / c.rdmabuf : c.rdmabuf / c.peer_figure;
        out.push_back(c);
        break;
      }
    }
  }
  return out;
}

std::string render_table(const RunInfo& info, const std::vector<Figure>& figures,
                         const std::vector<Comparison>& comparisons,
                         const std::map<std::string, std::vector<std::string>>& peers,
                         const std::vector<Skipped>& skipped) {
  std::string out;
  out += "rdmabuf " + info.version + " bench --compare, " + info.date + "\n";
  out += info.machine + "\n";
  out += "Medians: rdmabuf " + std::to_string(info.rdmabuf_reps) + " reps in each of " +
         std::to_string(info.rounds) + " rounds, peers one run in each round.\n";
  out += "xN: how many times faster rdmabuf is than the peer (above 1: rdmabuf is faster).\n";

  std::vector<std::string> backends;
  for (const Figure& f : figures) {
    if (!is_rdmabuf(f)) continue;
    std::string backend = f.system.substr(kRdmabufPrefix.size());
    if (std::find(backends.begin(), backends.end(), backend) == backends.end()) {
      backends.push_back(backend);
    }
  }
  for (const std::string& backend : backends) {
    const std::string system = std::string(kRdmabufPrefix) + backend;
    out += "\n== rdmabuf over " + backend + " ==\n";
    for (const char* kind : {"bandwidth", "latency", "rate"}) {
      std::vector<const Figure*> rows;
      for (const Figure& f : figures) {
        if (f.system == system && f.kind == kind) rows.push_back(&f);
      }
      if (rows.empty()) continue;
      std::stable_sort(rows.begin(), rows.end(), [](const Figure* a, const Figure* b) {
        return std::tie(a->op, a->size) < std::tie(b->op, b->size);
      });
      std::vector<std::string> columns;  // the peers with a figure of this kind
      auto listed = peers.find(backend);
      if (listed != peers.end()) {
        for (const std::string& peer : listed->second) {
          for (const Figure* f : rows) {
            if (find_comparison(comparisons, backend, peer, *f)) {
              columns.push_back(peer);
              break;
            }
          }
        }
      }
      // Beside bandwidth: rdmabuf's figure for ops spread over distinct
      // ranges, when it was measured (the peers have no such figure).
      auto spread_of = [&](const Figure& f) -> const Figure* {
        for (const Figure& g : figures) {
          if (g.system == system && g.kind == "bandwidth_spread" && g.op == f.op &&
              g.size == f.size) {
            return &g;
          }
        }
        return nullptr;
      };
      const bool with_spread =
          kind == std::string("bandwidth") &&
          std::any_of(rows.begin(), rows.end(), [&](const Figure* f) { return spread_of(*f); });
      const size_t first_width = kind == std::string("latency") ? 20 : 10;
      out += std::string(kind_heading(kind)) + "\n";
      out += pad("op", 6) + pad("size", 9) + pad_left("rdmabuf", first_width);
      if (with_spread) out += pad_left("spread", 9);
      for (const std::string& peer : columns)
        out += " | " + pad(peer, 16);
      out += "\n";
      for (const Figure* f : rows) {
        std::string cell = format_headline(kind, headline(*f));
        if (f->kind == "latency" && f->p99_us > 0) {
          cell += " (" + format_headline(kind, f->p99_us) + ")";
        }
        out += pad(f->op, 6) + pad(format_bytes(f->size), 9) + pad_left(cell, first_width);
        if (with_spread) {
          const Figure* spread = spread_of(*f);
          out += pad_left(spread ? format_headline(kind, spread->gbps) : "-", 9);
        }
        for (const std::string& peer : columns) {
          const Comparison* c = find_comparison(comparisons, backend, peer, *f);
          std::string text =
              c ? format_headline(kind, c->peer_figure) + " x" + fixed(c->speedup, 2) : "-";
          out += " | " + pad(text, 16);
        }
        out += "\n";
      }
    }
    std::map<std::string, const Figure*> setup;
    for (const Figure& f : figures) {
      if (f.system == system && f.kind == "setup") setup[f.op] = &f;
    }
    if (setup.count("first_transfer")) {
      out += "setup: first transfer to a new peer " +
             format_headline("setup", setup["first_transfer"]->p50_us) + " us";
      if (setup.count("register_first") && setup.count("register_again")) {
        out += "; registering " + format_bytes(setup["register_first"]->size) + ": first " +
               fixed(setup["register_first"]->p50_us, 1) + " us, again " +
               fixed(setup["register_again"]->p50_us, 1) + " us";
      }
      out += "\n";
    }
  }

  std::set<std::string> notes;
  for (const Figure& f : figures) {
    if (!f.note.empty()) notes.insert(f.system + ": " + f.note);
  }
  if (!notes.empty()) out += "\nHow peers' figures were taken:\n";
  for (const std::string& note : notes)
    out += "  " + note + "\n";
  if (!skipped.empty()) out += "\nNot measured:\n";
  for (const Skipped& s : skipped)
    out += "  " + s.system + ": " + s.why + "\n";
  out += "GB/s = 1e9 bytes per second. Reproduce: " + info.command + "\n";
  return out;
}

std::string render_json(const RunInfo& info, const std::vector<Figure>& figures,
                        const std::vector<Comparison>& comparisons,
                        const std::vector<Skipped>& skipped) {
  std::string out = "{\n";
  out += "  \"date\": " + json_quote(info.date) + ",\n";
  out += "  \"machine\": " + json_quote(info.machine) + ",\n";
  out += "  \"command\": " + json_quote(info.command) + ",\n";
  out += "  \"version\": " + json_quote(info.version) + ",\n";
  out += "  \"rounds\": " + std::to_string(info.rounds) + ",\n";
  out += "  \"rdmabuf_reps\": " + std::to_string(info.rdmabuf_reps) + ",\n";
  out += "  \"figures\": [";
  const char* sep = "\n";
  for (const Figure& f : figures) {
    out += sep;
    sep = ",\n";
    out += "    {\"system\": " + json_quote(f.system) + ", \"kind\": " + json_quote(f.kind) +
           ", \"op\": " + json_quote(f.op) + ", \"size\": " + std::to_string(f.size) +
           ", \"gbps\": " + json_number(f.gbps) + ", \"p50_us\": " + json_number(f.p50_us) +
           ", \"p99_us\": " + json_number(f.p99_us) +
           ", \"ops_per_s\": " + json_number(f.ops_per_s) + ", \"runs\": " + std::to_string(f.runs);
    if (!f.note.empty()) out += ", \"note\": " + json_quote(f.note);
    out += "}";
  }
  out += "\n  ],\n  \"comparisons\": [";
  sep = "\n";
  for (const Comparison& c : comparisons) {
    out += sep;
    sep = ",\n";
    out += "    {\"backend\": " + json_quote(c.backend) + ", \"peer\": " + json_quote(c.peer) +
           ", \"kind\": " + json_quote(c.kind) + ", \"op\": " + json_quote(c.op) +
           ", \"size\": " + std::to_string(c.size) + ", \"rdmabuf\": " + json_number(c.rdmabuf) +
           ", \"peer_figure\": " + json_number(c.peer_figure) +
           ", \"speedup\": " + json_number(c.speedup) + "}";
  }
  out += "\n  ],\n  \"skipped\": [";
  sep = "\n";
  for (const Skipped& s : skipped) {
    out += sep;
    sep = ",\n";
    out += "    {\"system\": " + json_quote(s.system) + ", \"why\": " + json_quote(s.why) + "}";
  }
  out += "\n  ]\n}\n";
  return out;
}

std::vector<PlotPanel> bandwidth_panels(const std::vector<Figure>& figures) {
  std::vector<PlotPanel> panels = {{"read (get)", {}}, {"write (put)", {}}};
  for (size_t p = 0; p < panels.size(); ++p) {
    const std::string op = p == 0 ? "read" : "write";
    for (const Figure& f : figures) {
      if (f.kind != "bandwidth" || (f.op != op && f.op != "stream") || f.gbps <= 0) continue;
      auto& series = panels[p].series;
      auto it = std::find_if(series.begin(), series.end(),
                             [&f](const PlotSeries& s) { return s.label == f.system; });
      if (it == series.end()) {
        series.push_back(PlotSeries{f.system, is_rdmabuf(f), {}});
        it = series.end() - 1;
      }
      it->points.emplace_back(f.size, f.gbps);
    }
  }
  return panels;
}

std::string json_quote(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

Result<std::map<std::string, std::string>> parse_flat_json_object(std::string_view text) {
  size_t i = 0;
  auto skip_space = [&] {
    while (i < text.size() &&
           (text[i] == ' ' || text[i] == '\t' || text[i] == '\r' || text[i] == '\n')) {
      ++i;
    }
  };
  auto bad = [&](const std::string& what) {
    return InvalidArgument("not a flat JSON object: " + what + " at byte " + std::to_string(i));
  };
  auto read_string = [&](std::string& out) -> Status {
    if (i >= text.size() || text[i] != '"') return bad("expected '\"'");
    for (++i; i < text.size() && text[i] != '"'; ++i) {
      if (text[i] != '\\') {
        out += text[i];
        continue;
      }
      if (++i >= text.size()) break;
      switch (text[i]) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          if (i + 4 >= text.size()) return bad("short \\u escape");
          unsigned code = 0;
          for (char h : text.substr(i + 1, 4)) {
            int digit = std::isxdigit(static_cast<unsigned char>(h))
                            ? (std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                                           : (h | 0x20) - 'a' + 10)
                            : -1;
            if (digit < 0) return bad("bad \\u escape");
            code = code * 16 + static_cast<unsigned>(digit);
          }
          out += code < 0x80 ? static_cast<char>(code) : '?';  // rdmabuf writes ASCII
          i += 4;
          break;
        }
        default:
          out += text[i];  // \" \\ \/
      }
    }
    if (i >= text.size()) return bad("unterminated string");
    ++i;
    return Status::Ok();
  };

  std::map<std::string, std::string> members;
  skip_space();
  if (i >= text.size() || text[i] != '{') return bad("expected '{'");
  ++i;
  skip_space();
  if (i < text.size() && text[i] == '}') return members;
  while (true) {
    skip_space();
    std::string key, value;
    RDMABUF_RETURN_IF_ERROR(read_string(key));
    skip_space();
    if (i >= text.size() || text[i] != ':') return bad("expected ':'");
    ++i;
    skip_space();
    if (i < text.size() && text[i] == '"') {
      RDMABUF_RETURN_IF_ERROR(read_string(value));
    } else {
      size_t start = i;
      while (i < text.size() && text[i] != ',' && text[i] != '}' && text[i] != ' ') {
        if (text[i] == '{' || text[i] == '[' || text[i] == '"') return bad("nested value");
        ++i;
      }
      if (i == start) return bad("missing value");
      value = std::string(text.substr(start, i - start));
    }
    members[key] = value;
    skip_space();
    if (i < text.size() && text[i] == ',') {
      ++i;
      continue;
    }
    if (i < text.size() && text[i] == '}') break;
    return bad("expected ',' or '}'");
  }
  ++i;
  skip_space();
  if (i != text.size()) return bad("trailing bytes");
  return members;
}

}  // namespace rdmabuf::tool
