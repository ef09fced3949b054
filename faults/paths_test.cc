#include "faults/test_paths.h"

namespace rdmalab::faults::testing {

const char* corpus_dir() { return RDMALAB_FAULTS_CORPUS; }
const char* switch_exe() { return RDMALAB_SWITCH_EXE; }

}  // namespace rdmalab::faults::testing
