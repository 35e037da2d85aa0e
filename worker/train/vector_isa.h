// The vector instruction sets a worker computes with besides OpenBLAS':
// which of lockstep's own vector kernels (max_pool.cc, fused_adam.cc) a
// process may run, and what oneDNN (LibTorch's convolutions) generates.
// lockstep's own run those the CPU has, capped as ATen caps its own kernels
// by ATEN_CPU_CAPABILITY ("default": none, "avx2": up to AVX2 + FMA,
// "avx512" or unset: every one the CPU has). So a worker told to compute as
// an older CPU does runs the same paths as that CPU would, and the tests
// that emulate one (tests/CMakeLists.txt, the CPU variants) reach them on
// any machine.
#ifndef LOCKSTEP_WORKER_TRAIN_VECTOR_ISA_H_
#define LOCKSTEP_WORKER_TRAIN_VECTOR_ISA_H_

#include <string>

namespace lockstep::worker {

enum class VectorIsa { kNone = 0, kAvx2 = 1, kAvx512 = 2 };

// The widest set allowed, decided once per process. Thread-safe.
VectorIsa AllowedVectorIsa();

// The instruction set oneDNN generates LibTorch's convolution kernels for,
// by the names ONEDNN_MAX_CPU_ISA takes ("AVX2", "AVX512_CORE_BF16", ...):
// its effective ISA (the CPU's, capped by ONEDNN_MAX_CPU_ISA or
// DNNL_MAX_CPU_ISA), asked of the oneDNN this process loaded. Without one
// whose functions can be found, the variable's value ("" when unset).
std::string OneDnnCpuIsa();

// True where LibTorch 1.13 would send bf16 convolutions and products to
// oneDNN (a CPU with AVX-512 BW, VL and DQ) but oneDNN has no bf16 kernels
// for its ISA (capped below AVX512_CORE by ONEDNN_MAX_CPU_ISA): they would
// fail ("could not create a primitive descriptor iterator"). Such a
// process computes bf16 as a CPU without AVX-512 does, in ATen's own
// kernels (the trainer turns oneDNN off for a bf16 generation).
bool OneDnnLacksBf16Kernels();

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_VECTOR_ISA_H_
