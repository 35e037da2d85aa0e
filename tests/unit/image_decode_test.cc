// Encoded images: PNG decodes losslessly, JPEG close to what was encoded,
// into the channels asked for; corrupt, truncated and oversized images are
// errors; resize, crop and flip move the pixels where they should.
#include "worker/data/image_decode.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <jpeglib.h>
#include <png.h>
#include <zlib.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/data/npy.h"

namespace lockstep::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A [height, width, 3] gradient with some structure.
std::vector<uint8_t> Pattern(int height, int width, int channels) {
  std::vector<uint8_t> pixels(static_cast<size_t>(height * width * channels));
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < channels; ++c) {
        pixels[(y * width + x) * channels + c] =
            static_cast<uint8_t>((y * 7 + x * 3 + c * 50) % 256);
      }
    }
  }
  return pixels;
}

std::string Png(const std::vector<uint8_t>& pixels, int height, int width,
                int channels) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = width;
  image.height = height;
  image.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  EXPECT_TRUE(png_image_write_to_memory(&image, nullptr, &size, 0,
                                        pixels.data(), 0, nullptr));
  std::string out(size, '\0');
  EXPECT_TRUE(png_image_write_to_memory(&image, out.data(), &size, 0,
                                        pixels.data(), 0, nullptr));
  out.resize(size);
  return out;
}

std::string Jpeg(const std::vector<uint8_t>& pixels, int height, int width) {
  jpeg_compress_struct info;
  jpeg_error_mgr errors;
  info.err = jpeg_std_error(&errors);
  jpeg_create_compress(&info);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&info, &buffer, &size);
  info.image_width = width;
  info.image_height = height;
  info.input_components = 3;
  info.in_color_space = JCS_RGB;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, 95, TRUE);
  jpeg_start_compress(&info, TRUE);
  while (info.next_scanline < info.image_height) {
    JSAMPROW row =
        const_cast<uint8_t*>(pixels.data()) + info.next_scanline * width * 3;
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  jpeg_destroy_compress(&info);
  std::string out(reinterpret_cast<char*>(buffer), size);
  free(buffer);
  return out;
}

TEST(ImageDecodeTest, PngDecodesExactlyInEveryChannelCount) {
  const std::vector<uint8_t> rgb = Pattern(9, 13, 3);
  const std::string png = Png(rgb, 9, 13, 3);
  auto image = DecodeImage(png, ImageEncoding::kPng, 3);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->height, 9);
  EXPECT_EQ(image->width, 13);
  EXPECT_EQ(image->pixels, rgb);
  auto rgba = DecodeImage(png, ImageEncoding::kAuto, 4);
  ASSERT_TRUE(rgba.ok()) << rgba.status();
  EXPECT_EQ(rgba->pixels[3], 255);  // opaque
  EXPECT_EQ(rgba->pixels[4], rgb[3]);
  const std::vector<uint8_t> grey = Pattern(5, 6, 1);
  auto g = DecodeImage(Png(grey, 5, 6, 1), ImageEncoding::kAuto, 1);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->pixels, grey);
  auto info = ReadImageInfo(png);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->format, ImageEncoding::kPng);
  EXPECT_EQ(info->channels, 3);
}

TEST(ImageDecodeTest, JpegDecodesCloseToWhatWasEncoded) {
  const std::vector<uint8_t> rgb = Pattern(16, 24, 3);
  const std::string jpeg = Jpeg(rgb, 16, 24);
  auto image = DecodeImage(jpeg, ImageEncoding::kJpeg, 3);
  ASSERT_TRUE(image.ok()) << image.status();
  ASSERT_EQ(image->pixels.size(), rgb.size());
  double error = 0;
  for (size_t i = 0; i < rgb.size(); ++i) {
    error += std::abs(int{image->pixels[i]} - int{rgb[i]});
  }
  EXPECT_LT(error / static_cast<double>(rgb.size()), 8.0);
  auto grey = DecodeImage(jpeg, ImageEncoding::kAuto, 1);
  ASSERT_TRUE(grey.ok()) << grey.status();
  EXPECT_EQ(grey->pixels.size(), 16u * 24u);
  auto info = ReadImageInfo(jpeg);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->format, ImageEncoding::kJpeg);
  EXPECT_EQ(info->width, 24);
}

TEST(ImageDecodeTest, DamagedImagesAreErrorsNotCrashes) {
  const std::string jpeg = Jpeg(Pattern(32, 32, 3), 32, 32);
  const std::string png = Png(Pattern(8, 8, 3), 8, 8, 3);
  // Cut short, anywhere.
  for (size_t cut : {size_t{4}, jpeg.size() / 3, jpeg.size() - 3}) {
    auto image = DecodeImage(jpeg.substr(0, cut), ImageEncoding::kJpeg, 3);
    EXPECT_FALSE(image.ok()) << "cut at " << cut;
  }
  // Inside the signature, the header, and the image data (IDAT's bytes
  // start at 41); a PNG cut only in its end marker still holds the image.
  for (size_t cut : {size_t{9}, size_t{30}, size_t{45}}) {
    EXPECT_FALSE(DecodeImage(png.substr(0, cut), ImageEncoding::kPng, 3).ok())
        << "cut at " << cut;
  }
  EXPECT_THAT(DecodeImage("hello", ImageEncoding::kAuto, 3).status().message(),
              HasSubstr("neither a JPEG nor a PNG"));
  EXPECT_THAT(DecodeImage(png, ImageEncoding::kJpeg, 3).status().message(),
              HasSubstr("declared jpeg but holds a png"));
  EXPECT_FALSE(DecodeImage(jpeg, ImageEncoding::kAuto, 2).ok());
}

// A PNG header claiming 40000 x 40000 pixels is refused before anything is
// allocated for it.
TEST(ImageDecodeTest, AnOversizedImageIsRefusedFromItsHeader) {
  std::string png = Png(Pattern(2, 2, 3), 2, 2, 3);
  // IHDR's width and height (big-endian) follow the signature, the chunk
  // length and its type; the chunk's CRC is made to match again.
  auto put = [&](size_t at, uint32_t v) {
    png[at] = static_cast<char>(v >> 24);
    png[at + 1] = static_cast<char>(v >> 16);
    png[at + 2] = static_cast<char>(v >> 8);
    png[at + 3] = static_cast<char>(v);
  };
  put(16, 40000);
  put(20, 40000);
  put(29, static_cast<uint32_t>(
              crc32(0, reinterpret_cast<const Bytef*>(png.data() + 12), 17)));
  EXPECT_THAT(DecodeImage(png, ImageEncoding::kPng, 3).status().message(),
              HasSubstr("40000x40000, more than 67108864 pixels"));
}

// Files Pillow wrote (tests/scripts/write_reference_images.py) and the
// pixels its Image.convert gives them, in a fresh folder.
class PillowImagesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = ::testing::TempDir() + "pillow_images_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = new std::string(tmpl);
    const std::string command =
        absl::StrCat("/usr/bin/python3 ", LOCKSTEP_SOURCE_DIR,
                     "/tests/scripts/write_reference_images.py ", *dir_);
    ASSERT_EQ(std::system(command.c_str()), 0)
        << command << " (needs python3-pil and python3-numpy)";
  }
  static void TearDownTestSuite() {
    std::system(absl::StrCat("rm -rf ", *dir_).c_str());
    delete dir_;
  }

  static std::string Read(const std::string& name) {
    std::ifstream in(*dir_ + "/" + name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // Decodes `file` into `channels` and compares with Pillow's pixels.
  static void ExpectPillowsPixels(const std::string& file,
                                  const std::string& name, int channels) {
    SCOPED_TRACE(absl::StrCat(file, " into ", channels, " channels"));
    auto image = DecodeImage(Read(file), ImageEncoding::kAuto, channels);
    ASSERT_TRUE(image.ok()) << image.status();
    auto expected =
        ReadNpy(absl::StrCat(*dir_, "/", name, "-", channels, ".npy"));
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_EQ(expected->shape,
              (std::vector<int64_t>{image->height, image->width, channels}));
    int differ = 0, largest = 0;
    for (size_t i = 0; i < image->pixels.size(); ++i) {
      const int d = std::abs(int{image->pixels[i]} -
                             int{static_cast<uint8_t>(expected->data[i])});
      differ += d != 0;
      largest = std::max(largest, d);
    }
    EXPECT_EQ(differ, 0) << differ << " values differ, by up to " << largest;
  }

  static std::string* dir_;
};

std::string* PillowImagesTest::dir_ = nullptr;

// Grey, RGB, RGBA, palette and interlaced PNGs and grey, RGB and
// progressive JPEGs decode into 1, 3 and 4 channels exactly as Pillow's
// Image.open(...).convert("L" / "RGB" / "RGBA") gives them: alpha dropped
// (not composited on black), grey by ITU-R 601-2 luma.
TEST_F(PillowImagesTest, EveryFormDecodesAsPillowConvertsIt) {
  for (const char* name :
       {"png-grey", "png-rgb", "png-rgba", "png-palette", "png-interlaced"}) {
    for (int channels : {1, 3, 4}) {
      ExpectPillowsPixels(absl::StrCat(name, ".png"), name, channels);
    }
  }
  for (const char* name : {"jpg-grey", "jpg-rgb", "jpg-progressive"}) {
    for (int channels : {1, 3, 4}) {
      ExpectPillowsPixels(absl::StrCat(name, ".jpg"), name, channels);
    }
  }
}

// 16 bits per sample become v / 257 rounded, as TensorFlow's decode_png to
// uint8 and OpenCV give them (libpng's simplified API took them for linear
// light: a mid grey of 32896 became 188).
TEST_F(PillowImagesTest, SixteenBitPngsScaleToEightBits) {
  for (const char* name : {"png16-grey", "png16-rgb"}) {
    for (int channels : {1, 3, 4}) {
      ExpectPillowsPixels(absl::StrCat(name, ".png"), name, channels);
    }
  }
}

// Issue 54: the antialiased resize is PIL's Image.resize(BILINEAR), pixel
// for pixel, shrinking, growing, and both at once, grey and RGB.
TEST_F(PillowImagesTest, AntialiasedResizeIsPils) {
  for (int channels : {3, 1}) {
    auto image =
        DecodeImage(Read("png-rgb.png"), ImageEncoding::kPng, channels);
    ASSERT_TRUE(image.ok()) << image.status();
    for (const auto& [name, height, width] :
         {std::tuple{"resize-down", 13, 20}, std::tuple{"resize-up", 40, 50},
          std::tuple{"resize-mixed", 9, 60}}) {
      SCOPED_TRACE(absl::StrCat(name, " ", channels));
      const Image resized = ResizeImageAntialias(*image, height, width);
      auto expected =
          ReadNpy(absl::StrCat(*dir_, "/", name, "-", channels, ".npy"));
      ASSERT_TRUE(expected.ok()) << expected.status();
      ASSERT_EQ(expected->shape,
                (std::vector<int64_t>{height, width, channels}));
      int differ = 0, largest = 0;
      for (size_t i = 0; i < resized.pixels.size(); ++i) {
        const int d = std::abs(int{resized.pixels[i]} -
                               int{static_cast<uint8_t>(expected->data[i])});
        differ += d != 0;
        largest = std::max(largest, d);
      }
      EXPECT_EQ(differ, 0) << differ << " values differ, by up to " << largest;
    }
  }
}

// A warning about an ancillary chunk (a damaged colour profile) leaves the
// pixels as they are; one about the image data is an error.
TEST_F(PillowImagesTest, PngWarningsAboutTheImageDataAreErrors) {
  auto profile = DecodeImage(Read("png-bad-iccp.png"), ImageEncoding::kPng, 3);
  ASSERT_TRUE(profile.ok()) << profile.status();
  auto plain = DecodeImage(Read("png-rgb.png"), ImageEncoding::kPng, 3);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(profile->pixels, plain->pixels);
  auto extra = DecodeImage(Read("png-extra-data.png"), ImageEncoding::kPng, 3);
  EXPECT_EQ(extra.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(extra.status().message(), HasSubstr("corrupt PNG"));
}

// A few-KB progressive JPEG declaring 8000 x 8000 pixels needs ~570 MiB to
// decode: refused with its size against a 256 MiB budget, before anything
// is allocated; within the budget, decodes that do not fit together wait
// for each other instead of holding it all.
TEST(ImageDecodeTest, DecodeMemoryIsBoundedAndShared) {
  std::string jpeg = Jpeg(Pattern(16, 16, 3), 16, 16);
  // Make it progressive in name (SOF2) and 8000 x 8000: the header is
  // refused before any scan is read.
  const size_t sof = jpeg.find("\xFF\xC0");
  ASSERT_NE(sof, std::string::npos);
  jpeg[sof + 1] = static_cast<char>(0xC2);
  for (size_t at : {sof + 5, sof + 7}) {
    jpeg[at] = static_cast<char>(8000 >> 8);
    jpeg[at + 1] = static_cast<char>(8000 & 0xFF);
  }
  DecodeBudget budget(int64_t{256} << 20);
  auto refused = DecodeImage(jpeg, ImageEncoding::kJpeg, 3, budget);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr("8000x8000"), HasSubstr("256 MiB")));
  EXPECT_EQ(budget.held(), 0);

  DecodeBudget small(1000);
  auto first = small.Reserve(600, 10, 20);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(small.held(), 600);
  std::atomic<bool> got{false};
  std::thread second([&] {
    auto reserved = small.Reserve(600, 10, 20);
    EXPECT_TRUE(reserved.ok());
    got = true;
  });
  // The second waits for the first's bytes; it cannot have them yet.
  EXPECT_FALSE(got.load());
  { auto released = std::move(*first); }
  second.join();
  EXPECT_TRUE(got.load());
  EXPECT_EQ(small.held(), 0);
}

// Channels first, for every channel count and sizes that are and are not
// a multiple of the 16 pixels the SSSE3 path takes at a time.
TEST(ImageDecodeTest, ChannelsFirstMovesEveryPixel) {
  for (int channels : {1, 3, 4}) {
    for (auto [height, width] : {std::pair{7, 5}, std::pair{16, 16},
                                 std::pair{17, 3}, std::pair{224, 224}}) {
      Image image;
      image.height = height;
      image.width = width;
      image.channels = channels;
      image.pixels = Pattern(height, width, channels);
      std::vector<uint8_t> out(image.pixels.size());
      ToChannelsFirst(image, out.data());
      const int64_t plane = int64_t{height} * width;
      for (int64_t p = 0; p < plane; ++p) {
        for (int c = 0; c < channels; ++c) {
          ASSERT_EQ(out[c * plane + p], image.pixels[p * channels + c])
              << channels << " channels, " << height << "x" << width
              << ", pixel " << p;
        }
      }
    }
  }
}

TEST(ImageDecodeTest, ResizeCropAndFlipPlaceThePixels) {
  Image image;
  image.height = 2;
  image.width = 2;
  image.channels = 1;
  image.pixels = {0, 100, 200, 255};
  Image same = ResizeImage(image, 2, 2);
  EXPECT_EQ(same.pixels, image.pixels);
  Image big = ResizeImage(image, 4, 4);
  EXPECT_EQ(big.pixels[0], 0);  // corners keep their values
  EXPECT_EQ(big.pixels[15], 255);
  Image crop = CropImage(big, 1, 1, 2, 2);
  EXPECT_EQ(crop.pixels.size(), 4u);
  EXPECT_EQ(crop.pixels[0], big.pixels[5]);
  FlipImage(&image);
  EXPECT_EQ(image.pixels, (std::vector<uint8_t>{100, 0, 255, 200}));
}

}  // namespace
}  // namespace lockstep::worker
