#include "bytecode/format.h"

namespace dvm::bc {

const OpInfo kOpInfo[kNumOpcodes] = {
#define DVM_OP(Name, mnemonic, format, family) {mnemonic, OperandFormat::format, Family::family},
#include "bytecode/isa.def"
};

}  // namespace dvm::bc
