// Highway targets of the tile kernels, defined before any Highway header in every file that
// compiles them. Keep the list short: every target multiplies the compile time of the kernels.
#ifndef DVM_VM_CPU_KERNEL_TARGETS_H_
#define DVM_VM_CPU_KERNEL_TARGETS_H_

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_AVX3_DL)
#endif

#endif  // DVM_VM_CPU_KERNEL_TARGETS_H_
