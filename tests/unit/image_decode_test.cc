// Encoded images: PNG decodes losslessly, JPEG close to what was encoded,
// into the channels asked for; corrupt, truncated and oversized images are
// errors; resize, crop and flip move the pixels where they should.
#include "worker/data/image_decode.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <jpeglib.h>
#include <png.h>
#include <zlib.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace lockstep::worker {
namespace {

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
