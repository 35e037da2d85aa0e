#!/usr/bin/python3
"""Writes an ImageNet-style TFRecord data set with Pillow, independently of
lockstep's own writer: JPEG (and a few PNG) images under "image/encoded",
the class under "image/class/label", variable-length box lists and other
features a model does not read. Also writes what Pillow decodes for the
first records, to compare lockstep's decoder with, and a file with a
truncated JPEG.

  write_image_records.py OUT_DIR [--train N] [--test N] [--size S]
                         [--files DIR] [--png-every N]

Classes are told apart by colour and by where a bar lies, under noise, so a
small model learns them from the decoded pixels. Runs on Debian's python3
with python3-pil and python3-numpy; no TensorFlow.
"""
import argparse
import io
import os
import struct

import numpy as np
from PIL import Image

CLASSES = 10


def crc32c_table():
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


TABLE = crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(n):
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        bits = n & 0x7F
        n >>= 7
        if n:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def field(number, wire, payload):
    key = varint((number << 3) | wire)
    if wire == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def bytes_feature(values):
    inner = b"".join(field(1, 2, v) for v in values)
    return field(1, 2, inner)  # Feature.bytes_list


def float_feature(values):
    packed = b"".join(struct.pack("<f", v) for v in values)
    return field(2, 2, field(1, 2, packed) if values else b"")


def int64_feature(values):
    packed = b"".join(varint(v) for v in values)
    return field(3, 2, field(1, 2, packed) if values else b"")


def example(features):
    entries = b""
    for name, feature in sorted(features.items()):
        entry = field(1, 2, name.encode()) + field(2, 2, feature)
        entries += field(1, 2, entry)
    return field(1, 2, entries)  # Example.features


def record(data):
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked(crc32c(length))) + data +
            struct.pack("<I", masked(crc32c(data))))


def picture(rng, label, size):
    """A class's picture: its colour, a bar at its place, noise."""
    hue = np.array([(label * 73) % 256, (label * 151) % 256,
                    (label * 29 + 100) % 256], dtype=np.float64)
    pixels = np.tile(hue, (size, size, 1))
    start = (label * size) // CLASSES
    pixels[:, start:start + max(2, size // CLASSES), :] = 255 - hue
    pixels += rng.normal(0, 12, pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


PNG_EVERY = 7


def encode(image, index):
    """Most images as baseline JPEG; every PNG_EVERY-th as PNG (none if 0)."""
    out = io.BytesIO()
    if PNG_EVERY > 0 and index % PNG_EVERY == 3:
        image.save(out, format="PNG")
        return out.getvalue(), b"PNG"
    image.save(out, format="JPEG", quality=90)
    return out.getvalue(), b"JPEG"


def write_split(path_pattern, files, count, size, rng, first_index,
                keep_decoded, files_dir=None):
    decoded = []
    per_file = (count + files - 1) // files
    index = first_index
    for f in range(files):
        path = path_pattern.format(f, files)
        with open(path, "wb") as out:
            for _ in range(min(per_file, count - f * per_file)):
                label = int(rng.integers(CLASSES))
                encoded, kind = encode(picture(rng, label, size), index)
                boxes = int(rng.integers(0, 4))
                features = {
                    "image/encoded": bytes_feature([encoded]),
                    "image/format": bytes_feature([kind]),
                    "image/height": int64_feature([size]),
                    "image/width": int64_feature([size]),
                    "image/class/label": int64_feature([label]),
                    "image/object/bbox/xmin":
                        float_feature([float(rng.random()) for _ in range(boxes)]),
                    "image/filename": bytes_feature([b"img-%d.jpg" % index]),
                }
                out.write(record(example(features)))
                if files_dir is not None and kind == b"JPEG":
                    with open(os.path.join(files_dir, "%06d.jpg" % index),
                              "wb") as f:
                        f.write(encoded)
                if len(decoded) < keep_decoded:
                    decoded.append(np.asarray(Image.open(io.BytesIO(encoded))))
                index += 1
    return decoded


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--test", type=int, default=500)
    parser.add_argument("--size", type=int, default=36)
    parser.add_argument("--files", help="also write the training JPEGs here")
    parser.add_argument("--png-every", type=int, default=7,
                        help="every Nth image a PNG (0: JPEGs only)")
    args = parser.parse_args()
    global PNG_EVERY
    PNG_EVERY = args.png_every
    os.makedirs(args.out, exist_ok=True)
    if args.files:
        os.makedirs(args.files, exist_ok=True)
    rng = np.random.default_rng(7)
    decoded = write_split(os.path.join(args.out, "train-{:05d}-of-{:05d}"),
                          2, args.train, args.size, rng, 0, 16, args.files)
    write_split(os.path.join(args.out, "validation-{:05d}-of-{:05d}"), 1,
                args.test, args.size, rng, args.train, 0)
    # What Pillow decodes for the first 16 training records, in order.
    np.save(os.path.join(args.out, "pillow_decoded.npy"), np.stack(decoded))
    # A record whose JPEG is cut short, after a good one.
    with open(os.path.join(args.out, "corrupt-00000-of-00001"), "wb") as out:
        for i in range(2):
            encoded, _ = encode(picture(rng, i, args.size), 0)
            if i == 1:
                encoded = encoded[:len(encoded) // 2]
            out.write(record(example({
                "image/encoded": bytes_feature([encoded]),
                "image/class/label": int64_feature([i]),
            })))


if __name__ == "__main__":
    main()
