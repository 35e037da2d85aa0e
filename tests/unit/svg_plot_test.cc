// compare's SVG plot: ticks, labels, escaping, skipped non-finite points and
// the cap on points per curve.
#include "client/svg_plot.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace lockstep::client {
namespace {

using ::testing::DoubleNear;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pointwise;

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

// The points attribute of the first polyline.
std::vector<std::string> Points(const std::string& svg) {
  const std::string key = "points=\"";
  const size_t begin = svg.find(key) + key.size();
  const std::string all = svg.substr(begin, svg.find('"', begin) - begin);
  std::vector<std::string> points;
  size_t at = 0;
  while (at < all.size()) {
    size_t space = all.find(' ', at);
    if (space == std::string::npos) space = all.size();
    points.push_back(all.substr(at, space - at));
    at = space + 1;
  }
  return points;
}

TEST(SvgPlotTest, TicksAreRoundStepsInsideTheRange) {
  using Ticks = std::vector<double>;
  EXPECT_THAT(NiceTicks(0, 1),
              Pointwise(DoubleNear(1e-12), Ticks{0, 0.2, 0.4, 0.6, 0.8, 1}));
  EXPECT_THAT(NiceTicks(3, 47),
              Pointwise(DoubleNear(1e-12), Ticks{10, 20, 30, 40}));
  EXPECT_THAT(NiceTicks(-1, 1),
              Pointwise(DoubleNear(1e-12), Ticks{-1, -0.5, 0, 0.5, 1}));
}

TEST(SvgPlotTest, DegenerateRangesGiveFewOrNoTicksAndEnd) {
  EXPECT_TRUE(NiceTicks(1, 1).empty());
  EXPECT_TRUE(NiceTicks(2, 1).empty());
  EXPECT_TRUE(NiceTicks(0, INFINITY).empty());
  // A step too small to move the value: the loop still ends.
  EXPECT_LE(NiceTicks(1e17, 1e17 + 1).size(), 13u);
}

TEST(SvgPlotTest, TickLabelsShortenThousandsAndMillions) {
  EXPECT_EQ(TickLabel(0.25), "0.25");
  EXPECT_EQ(TickLabel(1500), "1.5k");
  EXPECT_EQ(TickLabel(2000000), "2M");
}

TEST(SvgPlotTest, LabelsFromJobsAreEscaped) {
  Curve curve{"<job&\"1\">", {0, 1}, {1, 2}};
  const std::string svg = PlotSvg({{"a<b", "x&y"}}, {{curve}});
  EXPECT_THAT(svg, HasSubstr("&lt;job&amp;&quot;1&quot;&gt;"));
  EXPECT_THAT(svg, HasSubstr("a&lt;b"));
  EXPECT_THAT(svg, HasSubstr("x&amp;y"));
  EXPECT_THAT(svg, Not(HasSubstr("<job")));
}

TEST(SvgPlotTest, OnePanelPerSetOfCurvesAndALegend) {
  Curve a{"job-1", {0, 1, 2}, {3, 2, 1}};
  Curve b{"job-2", {0, 1, 2}, {3, 2.5, 2}};
  const std::string svg = PlotSvg(
      {{"by step", "step"}, {"by samples", "samples"}}, {{a, b}, {a, b}});
  EXPECT_THAT(svg, HasSubstr("width=\"1040\""));
  EXPECT_EQ(Count(svg, "<polyline"), 4u);
  EXPECT_EQ(Count(svg, "<title>job-1</title>"), 2u);
  EXPECT_EQ(Count(svg, ">job-2</text>"), 1u);  // the legend
  EXPECT_THAT(svg, HasSubstr("</svg>\n"));
}

TEST(SvgPlotTest, NonFinitePointsAreSkipped) {
  Curve curve{"c", {0, 1, 2, 3}, {1, NAN, INFINITY, 2}};
  const std::vector<std::string> points =
      Points(PlotSvg({{"t", "x"}}, {{curve}}));
  EXPECT_EQ(points.size(), 2u);
  for (const std::string& point : points) {
    EXPECT_THAT(point, Not(HasSubstr("nan")));
    EXPECT_THAT(point, Not(HasSubstr("inf")));
  }
}

TEST(SvgPlotTest, LongCurvesAreDrawnWithAboutAThousandPoints) {
  Curve curve{"long", {}, {}};
  for (int i = 0; i < 100000; ++i) {
    curve.x.push_back(i);
    curve.y.push_back(1.0 / (1 + i));
  }
  const size_t n = Points(PlotSvg({{"t", "x"}}, {{curve}})).size();
  EXPECT_GE(n, 1000u);
  EXPECT_LE(n, 1001u);
}

TEST(SvgPlotTest, AnEmptyCurveStillMakesAValidDocument) {
  const std::string svg = PlotSvg({{"t", "x"}}, {{Curve{"none", {}, {}}}});
  EXPECT_THAT(svg, HasSubstr("points=\"\""));
  EXPECT_THAT(svg, Not(HasSubstr("nan")));
}

}  // namespace
}  // namespace lockstep::client
