// The loss-curve plot of `lockstep compare --svg`: one SVG document, one
// panel per set of curves, side by side, with round ticks and a legend.
#ifndef LOCKSTEP_CLIENT_SVG_PLOT_H_
#define LOCKSTEP_CLIENT_SVG_PLOT_H_

#include <string>
#include <utility>
#include <vector>

namespace lockstep::client {

// One curve: y[i] at x[i] (non-finite values are skipped).
struct Curve {
  std::string label;
  std::vector<double> x;
  std::vector<double> y;
};

// The SVG document: panel p is titled titles[p].first, its x axis labelled
// titles[p].second, and draws panels[p]; the legend lists panels[0]'s
// labels. Curves of more than ~1000 points are drawn as means over equal
// runs of points. Every label is escaped for XML.
std::string PlotSvg(
    const std::vector<std::pair<std::string, std::string>>& titles,
    const std::vector<std::vector<Curve>>& panels);

// Round tick values inside [lo, hi]: steps of 1, 2 or 5 times a power of 10.
std::vector<double> NiceTicks(double lo, double hi);

// A tick's label: 1500 → "1.5k", 2000000 → "2M".
std::string TickLabel(double v);

// `text` with &, <, > and " escaped for XML text and attributes.
std::string EscapeXml(const std::string& text);

}  // namespace lockstep::client

#endif  // LOCKSTEP_CLIENT_SVG_PLOT_H_
