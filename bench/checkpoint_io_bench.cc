// Checkpoint write bandwidth against `dd` to the same disk, in one
// invocation: a rank's prepare (write + fsync of each file, fsync of the
// folder, SHA-256 of the contents) of SIZE_MB, and the chief's commit and a
// full verification of the result (read back + SHA-256), each the median of
// TRIALS, next to `dd if=/dev/zero bs=1M conv=fsync` of the same size.
//
//   checkpoint_io_bench DIR [SIZE_MB] [TRIALS]   default 256 MiB, 5 trials
//   checkpoint_io_bench DIR 1 1                  a smoke run
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/store.h"
#include "common/files.h"
#include "common/sha256.h"

namespace {

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double Seconds(absl::Time start) {
  return absl::ToDoubleSeconds(absl::Now() - start);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: checkpoint_io_bench DIR [SIZE_MB] [TRIALS]\n";
    return 2;
  }
  const std::string dir = argv[1];
  const int size_mb = argc > 2 ? atoi(argv[2]) : 256;
  const int trials = argc > 3 ? atoi(argv[3]) : 5;
  if (size_mb < 1 || trials < 1) {
    std::cerr << "checkpoint_io_bench: SIZE_MB and TRIALS must be positive\n";
    return 2;
  }
  namespace ckpt = lockstep::checkpoint;

  // Incompressible contents, as model weights are.
  std::string blob(static_cast<size_t>(size_mb) << 20, '\0');
  std::mt19937_64 random(1);
  for (size_t i = 0; i + 8 <= blob.size(); i += 8) {
    uint64_t v = random();
    blob.replace(i, 8, reinterpret_cast<const char*>(&v), 8);
  }
  // The contents a rank hands to the prepare, built once.
  const std::vector<ckpt::NamedFile> contents = {{"model.pt", blob}};
  std::vector<double> dd, plain, hash, prepare, commit, verify;
  for (int t = 0; t < trials; ++t) {
    const std::string backup = absl::StrCat(dir, "/bench-", t);
    if (absl::Status made = lockstep::MakeDirectories(backup); !made.ok()) {
      std::cerr << made << "\n";
      return 1;
    }
    std::string command = absl::StrCat("dd if=/dev/zero of='", backup,
                                       "/dd.bin' bs=1M count=", size_mb,
                                       " conv=fsync status=none");
    absl::Time start = absl::Now();
    if (std::system(command.c_str()) != 0) {
      std::cerr << "dd failed in " << backup << "\n";
      return 1;
    }
    dd.push_back(Seconds(start));

    start = absl::Now();
    if (!lockstep::WriteFileDurably(backup + "/plain.bin", blob).ok()) return 1;
    plain.push_back(Seconds(start));
    start = absl::Now();
    if (!lockstep::Sha256Hex(blob).ok()) return 1;
    hash.push_back(Seconds(start));

    start = absl::Now();
    auto files = ckpt::Prepare(backup, 0, 100, contents);
    prepare.push_back(Seconds(start));
    if (!files.ok()) {
      std::cerr << files.status() << "\n";
      return 1;
    }
    lockstep::v1::Manifest manifest;
    manifest.set_step(100);
    manifest.set_world_size(1);
    start = absl::Now();
    auto committed = ckpt::Commit(
        backup, manifest, {{ckpt::PrepareDir(0, 100), *std::move(files)}});
    commit.push_back(Seconds(start));
    if (!committed.ok()) {
      std::cerr << committed.status() << "\n";
      return 1;
    }
    start = absl::Now();
    auto verified = ckpt::Verify(backup + "/" + ckpt::CheckpointName(100));
    verify.push_back(Seconds(start));
    if (!verified.ok()) {
      std::cerr << verified.status() << "\n";
      return 1;
    }
    if (absl::Status removed = lockstep::RemoveRecursively(backup);
        !removed.ok()) {
      std::cerr << removed << "\n";
      return 1;
    }
  }
  const double mb = size_mb * 1.048576;
  const double ref = mb / Median(dd);
  std::printf("%d MiB, median of %d trials, in %s\n", size_mb, trials,
              dir.c_str());
  std::printf("%-40s %10s %8s\n", "operation", "MB/s", "vs dd");
  std::printf("%-40s %10.0f %8.2f\n", "dd bs=1M conv=fsync (reference)", ref,
              1.0);
  auto row = [&](const char* name, const std::vector<double>& s) {
    double rate = mb / Median(s);
    std::printf("%-40s %10.0f %8.2f\n", name, rate, rate / ref);
  };
  row("write + fsync, 1 MiB chunks (files.h)", plain);
  row("SHA-256 in memory", hash);
  row("prepare: write + fsync + SHA-256", prepare);
  row("commit: rename, manifest, fsyncs", commit);
  row("verify: read back + SHA-256", verify);
  return 0;
}
