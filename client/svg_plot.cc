// The loss-curve plot of `lockstep compare --svg` (svg_plot.h).
#include "client/svg_plot.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace lockstep::client {
namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                   "#9467bd", "#8c564b", "#e377c2", "#17becf"};
constexpr size_t kColorCount = sizeof(kColors) / sizeof(kColors[0]);
constexpr double kPanelW = 520, kPanelH = 360, kLeft = 64, kRight = 16,
                 kTop = 36, kBottom = 48, kLegend = 28;
// A curve is drawn with at most about this many points.
constexpr size_t kMaxPoints = 1000;

// Where a panel draws, and the data range it maps there.
struct Frame {
  double x0, x1, y0, y1;          // the plot area, in pixels
  double xmin, xmax, ymin, ymax;  // the data shown

  double X(double x) const {
    return x0 + (x - xmin) / (xmax - xmin) * (x1 - x0);
  }
  double Y(double y) const {
    return y1 - (y - ymin) / (ymax - ymin) * (y1 - y0);
  }
};

// Panel p's frame, its range spanning every finite point of `curves`.
Frame FrameOf(size_t p, const std::vector<Curve>& curves) {
  Frame f{kPanelW * p + kLeft,
          kPanelW * (p + 1) - kRight,
          kTop,
          kPanelH - kBottom,
          INFINITY,
          -INFINITY,
          INFINITY,
          -INFINITY};
  for (const Curve& curve : curves) {
    for (size_t i = 0; i < std::min(curve.x.size(), curve.y.size()); ++i) {
      if (!std::isfinite(curve.x[i]) || !std::isfinite(curve.y[i])) continue;
      f.xmin = std::min(f.xmin, curve.x[i]);
      f.xmax = std::max(f.xmax, curve.x[i]);
      f.ymin = std::min(f.ymin, curve.y[i]);
      f.ymax = std::max(f.ymax, curve.y[i]);
    }
  }
  if (!std::isfinite(f.xmin)) {  // nothing to draw
    f.xmin = 0, f.xmax = 1, f.ymin = 0, f.ymax = 1;
  }
  if (!(f.xmax > f.xmin)) f.xmax = f.xmin + 1;
  if (!(f.ymax > f.ymin)) f.ymax = f.ymin + 1;
  return f;
}

// The title, the box, the ticks with grid lines and the axis labels.
void AppendAxes(const Frame& f,
                const std::pair<std::string, std::string>& title,
                std::string* svg) {
  absl::StrAppendFormat(
      svg,
      "<text x=\"%.1f\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">"
      "%s</text>\n"
      "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
      "fill=\"none\" stroke=\"#888\"/>\n",
      (f.x0 + f.x1) / 2, EscapeXml(title.first), f.x0, f.y0, f.x1 - f.x0,
      f.y1 - f.y0);
  for (double x : NiceTicks(f.xmin, f.xmax)) {
    absl::StrAppendFormat(
        svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
        f.X(x), f.y1 + 16, TickLabel(x));
  }
  for (double y : NiceTicks(f.ymin, f.ymax)) {
    absl::StrAppendFormat(
        svg,
        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n"
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
        "stroke=\"#eee\"/>\n",
        f.x0 - 6, f.Y(y) + 4, TickLabel(y), f.x0, f.Y(y), f.x1, f.Y(y));
  }
  absl::StrAppendFormat(
      svg,
      "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n"
      "<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 16 %.1f)\">loss</text>\n",
      (f.x0 + f.x1) / 2, f.y1 + 36, EscapeXml(title.second), (f.y0 + f.y1) / 2,
      (f.y0 + f.y1) / 2);
}

// The curve as a polyline of means over equal runs of at most kMaxPoints
// points.
void AppendCurve(const Frame& f, const Curve& curve, const char* color,
                 std::string* svg) {
  const size_t n = std::min(curve.x.size(), curve.y.size());
  const size_t stride = std::max<size_t>(1, n / kMaxPoints);
  std::vector<std::string> points;
  for (size_t i = 0; i < n; i += stride) {
    double sum = 0;
    size_t count = 0;
    for (size_t j = i; j < std::min(n, i + stride); ++j) {
      if (std::isfinite(curve.y[j])) sum += curve.y[j], ++count;
    }
    if (count == 0 || !std::isfinite(curve.x[i])) continue;
    points.push_back(
        absl::StrFormat("%.1f,%.1f", f.X(curve.x[i]), f.Y(sum / count)));
  }
  absl::StrAppendFormat(
      svg,
      "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
      "points=\"%s\"><title>%s</title></polyline>\n",
      color, absl::StrJoin(points, " "), EscapeXml(curve.label));
}

void AppendLegend(const std::vector<Curve>& curves, std::string* svg) {
  double x = kLeft;
  for (size_t c = 0; c < curves.size(); ++c) {
    absl::StrAppendFormat(
        svg,
        "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"4\" fill=\"%s\"/>"
        "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
        x, kPanelH + 6, kColors[c % kColorCount], x + 18, kPanelH + 12,
        EscapeXml(curves[c].label));
    x += 24 + 7.0 * curves[c].label.size();
  }
}

}  // namespace

std::vector<double> NiceTicks(double lo, double hi) {
  const double raw = (hi - lo) / 5;
  if (!(raw > 0) || !std::isfinite(raw)) return {};
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  // A step too small to move v (a range tiny against its values) ends the
  // loop through the count.
  const double first = std::ceil(lo / step) * step;
  for (int i = 0; i <= 12; ++i) {
    const double v = first + i * step;
    if (v > hi + step * 1e-9) break;
    ticks.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  }
  return ticks;
}

std::string TickLabel(double v) {
  if (std::abs(v) >= 1e6) return absl::StrFormat("%gM", v / 1e6);
  if (std::abs(v) >= 1e3) return absl::StrFormat("%gk", v / 1e3);
  return absl::StrFormat("%g", v);
}

std::string EscapeXml(const std::string& text) {
  std::string out;
  out.reserve(text.size());
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
      default:
        out += c;
    }
  }
  return out;
}

std::string PlotSvg(
    const std::vector<std::pair<std::string, std::string>>& titles,
    const std::vector<std::vector<Curve>>& panels) {
  const double width = kPanelW * panels.size();
  const double height = kPanelH + kLegend;
  std::string svg = absl::StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
      "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" "
      "fill=\"white\"/>\n",
      width, height, width, height);
  for (size_t p = 0; p < panels.size(); ++p) {
    const Frame frame = FrameOf(p, panels[p]);
    AppendAxes(
        frame,
        p < titles.size() ? titles[p] : std::pair<std::string, std::string>(),
        &svg);
    for (size_t c = 0; c < panels[p].size(); ++c) {
      AppendCurve(frame, panels[p][c], kColors[c % kColorCount], &svg);
    }
  }
  if (!panels.empty()) AppendLegend(panels[0], &svg);
  svg += "</svg>\n";
  return svg;
}

}  // namespace lockstep::client
