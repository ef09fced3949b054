"""rdmalab's benchmarks (`make bench`): every figure is printed beside a reference measured in
the same run, as a ratio, never against a number written down earlier."""
