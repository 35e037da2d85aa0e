// Decoded images per second: lockstep's JPEG/PNG decoder on one core (the
// raw decode of every file in a folder, repeated), and a TFRecord split of
// encoded images read in batches of 64 through the data threads (1 and 2).
// bench/image_decode.sh runs it against Pillow on the same files.
//
//   image_decode_bench FILES_DIR RECORDS_DIR SIZE SECONDS
//
// FILES_DIR: *.jpg / *.png files; RECORDS_DIR: train-* TFRecords whose
// "image/encoded" feature holds SIZE x SIZE RGB images. Prints one JSON
// line: {"decode_per_core": ..., "decode_2_threads": ...,
// "records_1_thread": ..., "records_2_threads": ...} (images/s): the raw
// decode on 1 and 2 threads is what the records on 1 and 2 data threads
// are measured against.
#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "worker/data/image_decode.h"
#include "worker/data/split_source.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

std::vector<std::string> ReadFiles(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return {};
  while (dirent* entry = readdir(d)) {
    const std::string name = entry->d_name;
    if (absl::EndsWith(name, ".jpg") || absl::EndsWith(name, ".png")) {
      names.push_back(dir + "/" + name);
    }
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  std::vector<std::string> files;
  for (const std::string& name : names) {
    std::ifstream in(name, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    files.push_back(bytes.str());
  }
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lockstep::worker;
  int size = 0;
  double seconds = 0;
  if (argc != 5 || !absl::SimpleAtoi(argv[3], &size) ||
      !absl::SimpleAtod(argv[4], &seconds)) {
    std::cerr << "usage: image_decode_bench FILES_DIR RECORDS_DIR SIZE "
                 "SECONDS\n";
    return 2;
  }
  const std::vector<std::string> files = ReadFiles(argv[1]);
  if (files.empty()) {
    std::cerr << "no .jpg or .png files in " << argv[1] << "\n";
    return 1;
  }
  // Raw decodes on 1 and on 2 threads, each through every file in turn.
  double raw[2] = {0, 0};
  for (int threads : {1, 2}) {
    std::vector<int64_t> decoded(static_cast<size_t>(threads), 0);
    std::atomic<bool> failed{false};
    const Clock::time_point start = Clock::now();
    auto run = [&](int t) {
      while (Seconds(start) < seconds && !failed) {
        for (const std::string& bytes : files) {
          auto image = DecodeImage(bytes, ImageEncoding::kAuto, 3);
          if (!image.ok()) {
            std::cerr << image.status() << "\n";
            failed = true;
            return;
          }
          ++decoded[t];
        }
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(run, t);
    run(0);
    for (std::thread& thread : pool) thread.join();
    if (failed) return 1;
    int64_t total = 0;
    for (int64_t n : decoded) total += n;
    raw[threads - 1] = total / Seconds(start);
  }
  const double per_core = raw[0];

  // The TFRecord split, a batch of 64 at a time, through the data threads.
  lockstep::v1::DataSpec spec;
  spec.set_format("tfrecord");
  spec.set_dir(argv[2]);
  spec.set_train("train-*");
  lockstep::v1::ColumnSpec& image = (*spec.mutable_features())["image"];
  image.set_from("image/encoded");
  image.set_encoding("auto");
  image.set_dtype("uint8");
  for (int d : {size, size, 3}) image.add_shape(d);
  double rates[2] = {0, 0};
  for (int threads : {1, 2}) {
    SetDataThreads(threads);
    auto split = OpenSplit(spec, /*train=*/true);
    if (!split.ok()) {
      std::cerr << split.status() << "\n";
      return 1;
    }
    const int64_t n = (*split)->size();
    std::vector<char> out(static_cast<size_t>(64) * size * size * 3);
    std::vector<int64_t> batch(64);
    int64_t read = 0;
    const Clock::time_point begin = Clock::now();
    for (int64_t next = 0; Seconds(begin) < seconds; next += 64) {
      for (int i = 0; i < 64; ++i) batch[i] = (next + i) % n;
      absl::Status status = (*split)->ReadColumn(0, batch, out.data());
      if (!status.ok()) {
        std::cerr << status << "\n";
        return 1;
      }
      read += 64;
    }
    rates[threads - 1] = read / Seconds(begin);
  }
  std::printf(
      "{\"decode_per_core\": %.1f, \"decode_2_threads\": %.1f, "
      "\"records_1_thread\": %.1f, \"records_2_threads\": %.1f, "
      "\"files\": %zu}\n",
      per_core, raw[1], rates[0], rates[1], files.size());
  return 0;
}
