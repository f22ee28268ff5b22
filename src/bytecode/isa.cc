#include "bytecode/format.h"

namespace dvm::bc {

const OpInfo kOpInfo[kNumOpcodes] = {
#define DVM_OP(Name, mnemonic, format, family) {mnemonic, OperandFormat::format, Family::family},
#include "bytecode/isa.def"
};

bool descriptor_span(const Program& p, const Descriptor& d, int64_t* lo, int64_t* hi) {
  *lo = *hi = d.offset;
  for (size_t a = 0; a < p.axes.size(); ++a) {
    if (p.axes[a].extent == 0) return false;
    int64_t ext = (p.axes[a].extent - 1) * d.stride[a];
    if (ext < 0) {
      *lo += ext;
    } else {
      *hi += ext;
    }
  }
  return true;
}

}  // namespace dvm::bc
