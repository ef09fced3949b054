// Where the faults tests find this build's files. Defined in paths_test.cc, the one test file
// compiled with the clone's absolute paths, so that ccache shares every other test file between
// clones of the project.
#pragma once

namespace rdmalab::faults::testing {

const char* corpus_dir();  // faults/corpus: real frames, as hex
const char* switch_exe();  // this build's rdmalab-switch executable

}  // namespace rdmalab::faults::testing
