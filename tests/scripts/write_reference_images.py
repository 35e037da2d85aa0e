#!/usr/bin/python3
"""Writes PNG and JPEG files with Pillow, and what lockstep's decoder must
give for each, for tests/unit/image_decode_test.cc (issue 54):

  write_reference_images.py OUT_DIR

For each NAME: NAME.png or NAME.jpg, and NAME-C.npy, the uint8 [H, W, C]
pixels Pillow's Image.open(...).convert() gives for C channels (1 "L",
3 "RGB", 4 "RGBA"). Two PNGs of 16 bits per sample get v / 257 rounded
instead (TensorFlow's decode_png to uint8 and OpenCV; Pillow keeps 16-bit
grey as I;16 and clips it). Also: a PNG whose colour profile (iCCP) is
damaged, which libpng warns about and whose pixels are intact, and a PNG
whose zlib stream holds more image data than its rows, whose pixels are
not what the file says.

Runs on Debian's python3 with python3-pil and python3-numpy.
"""
import io
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image

MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def pattern(height, width, channels, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(y * 7 + x * 3 + c * 50) % 256 for c in range(channels)],
                    axis=-1)
    noise = rng.integers(0, 40, (height, width, channels))
    return ((base + noise) % 256).astype(np.uint8)


def save_references(out, name, image):
    for channels, mode in MODES.items():
        pixels = np.asarray(image.convert(mode)).reshape(
            image.height, image.width, channels)
        np.save(os.path.join(out, "%s-%d.npy" % (name, channels)), pixels)


def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(
        ">I", zlib.crc32(body) & 0xFFFFFFFF)


def png_16(out, name, samples, colour):
    """A 16-bit PNG written by hand (colour 0 grey, 2 RGB) and its v / 257
    references."""
    height, width = samples.shape[:2]
    rows = b"".join(b"\0" + samples[y].astype(">u2").tobytes()
                    for y in range(height))
    data = (b"\x89PNG\r\n\x1a\n" +
            chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 16, colour,
                                       0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    with open(os.path.join(out, name + ".png"), "wb") as f:
        f.write(data)
    eight = np.floor(samples.astype(np.float64) / 257 + 0.5).astype(np.uint8)
    if eight.ndim == 2:
        eight = eight[:, :, None]
    image = Image.fromarray(eight[:, :, 0] if eight.shape[2] == 1 else eight)
    save_references(out, name, image)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rgb = pattern(21, 34, 3, 1)
    rgba = pattern(21, 34, 4, 2)
    grey = pattern(21, 34, 1, 3)[:, :, 0]
    images = {
        "png-grey": Image.fromarray(grey, "L"),
        "png-rgb": Image.fromarray(rgb, "RGB"),
        "png-rgba": Image.fromarray(rgba, "RGBA"),
        "png-palette": Image.fromarray(rgb, "RGB").quantize(37),
        "png-interlaced": Image.fromarray(rgb, "RGB"),
    }
    for name, image in images.items():
        path = os.path.join(out, name + ".png")
        image.save(path, interlace=name == "png-interlaced")
        # Compared with what Pillow reads back from the file.
        save_references(out, name, Image.open(path))
    for name, image, options in (
            ("jpg-grey", Image.fromarray(grey, "L"), {}),
            ("jpg-rgb", Image.fromarray(rgb, "RGB"), {}),
            ("jpg-progressive", Image.fromarray(rgb, "RGB"),
             {"progressive": True})):
        path = os.path.join(out, name + ".jpg")
        image.save(path, quality=90, **options)
        save_references(out, name, Image.open(path))

    # PIL's bilinear resize (antialiased when shrinking), as torchvision
    # resizes PIL images: [H, W, C] references.
    for name, size in (("resize-down", (20, 13)), ("resize-up", (50, 40)),
                       ("resize-mixed", (60, 9))):
        for mode, channels in (("RGB", 3), ("L", 1)):
            resized = images["png-rgb"].convert(mode).resize(size,
                                                             Image.BILINEAR)
            np.save(os.path.join(out, "%s-%d.npy" % (name, channels)),
                    np.asarray(resized).reshape(size[1], size[0], channels))

    # 16 bits per sample: a mid grey of 32896 is 128, not 188.
    ramp = (np.arange(21 * 34, dtype=np.uint32).reshape(21, 34) * 89 +
            32896 - 300) % 65536
    png_16(out, "png16-grey", ramp.astype(np.uint16), 0)
    png_16(out, "png16-rgb",
           np.stack([ramp, 65535 - ramp, ramp // 2], -1).astype(np.uint16), 2)

    # A damaged colour profile: a warning about an ancillary chunk.
    buffer = io.BytesIO()
    images["png-rgb"].save(buffer, "PNG", icc_profile=b"not a profile" * 20)
    with open(os.path.join(out, "png-bad-iccp.png"), "wb") as f:
        f.write(buffer.getvalue())
    # More image data than the rows hold, in the one zlib stream (libpng:
    # "IDAT: Too much image data", a warning).
    height, width = rgb.shape[:2]
    rows = b"".join(b"\0" + rgb[y].tobytes() for y in range(height))
    with open(os.path.join(out, "png-extra-data.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" +
                chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                           0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(rows + b"\0" * 64)) +
                chunk(b"IEND", b""))


if __name__ == "__main__":
    main()
