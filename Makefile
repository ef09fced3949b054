# rdmalab: make deps | build | test | run. Debian 12; Python is /usr/bin/python3 (the python3
# first on PATH may be another interpreter that lacks python3-pybind11 / python3-pytest).

PYTHON     ?= /usr/bin/python3
JOBS       ?= 2
BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
LAB        ?= model
OUT        ?= out

DEBS := build-essential cmake ninja-build g++ libgtest-dev googletest nlohmann-json3-dev \
        pybind11-dev python3-dev python3-pybind11 python3-pytest python3-execnet \
        libibverbs-dev librdmacm-dev pkg-config prometheus-cpp-dev \
        prometheus prometheus-pushgateway python3-yaml python3-rpyc nftables clang libclang-rt-14-dev

export PYTHONPATH := $(CURDIR)/bindings$(if $(PYTHONPATH),:$(PYTHONPATH))
PYTEST := $(PYTHON) -m pytest -p rdmalab.pytest_plugin

.PHONY: all deps build build-asan test test-cpp test-asan test-python run format tidy clean \
        vmlab-deps vmlab test-vm fuzz test-fuzz

all: build

# $(call install_missing,PACKAGES): installs only what is missing; apt needs root (sudo is
# used when not root).
define install_missing
	@missing=""; \
	for p in $(1); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed$$' \
	    || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi; \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q < /dev/null && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	    $$missing < /dev/null; \
	else \
	  echo "deps: all installed"; \
	fi
endef

deps:
	$(call install_missing,$(DEBS))

# The soft-RoCE VM lab (lab/vmlab, docs/vmlab.md): its host packages, then the kernel, siw.ko and
# initrd (cached in .cache/vmlab), then two qemu hosts per provider running rping/pingpong.
VMLAB_DEBS := $(shell grep -v '^\s*\#' lab/vmlab/deps.txt 2>/dev/null)

vmlab-deps:
	$(call install_missing,$(VMLAB_DEBS))

vmlab: vmlab-deps
	PYTHONPATH=$(CURDIR) $(PYTHON) -m lab.vmlab prepare
	PYTHONPATH=$(CURDIR) $(PYTHON) -m lab.vmlab selftest

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(BUILD) -j$(JOBS)

# The engine and its GoogleTest tests under AddressSanitizer + UBSan (no Python module).
build-asan: deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DRDMALAB_SANITIZE=ON -DRDMALAB_PYTHON=OFF
	cmake --build $(ASAN_BUILD) -j$(JOBS)

# The switch's frame parser, rule matcher and corrupter under libFuzzer + ASan/UBSan (clang),
# for FUZZ_SECONDS on a seed corpus of real and built frames; a crash fails the target and
# leaves crash-* in $(FUZZ_BUILD).
fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DRDMALAB_FUZZ=ON -DRDMALAB_PYTHON=OFF
	cmake --build $(FUZZ_BUILD) -j$(JOBS) --target rdmalab_fuzz_frame rdmalab_fuzz_corpus
	$(FUZZ_BUILD)/faults/rdmalab_fuzz_corpus $(FUZZ_BUILD)/corpus
	cd $(FUZZ_BUILD) && ./faults/rdmalab_fuzz_frame -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	  -print_final_stats=1 corpus

test-cpp: build
	ctest --test-dir $(BUILD) -j$(JOBS) --output-on-failure

test-asan: build-asan
	ctest --test-dir $(ASAN_BUILD) -j$(JOBS) --output-on-failure

test-python: build
	$(PYTEST) tests/python tests/scenarios tests/metrics --lab $(LAB)

test: test-cpp test-asan test-python test-fuzz test-vm

# The switch's fuzz target, bounded, as part of `test` (make fuzz for a longer run).
TEST_FUZZ_SECONDS ?= 30

test-fuzz:
	$(MAKE) fuzz FUZZ_SECONDS=$(TEST_FUZZ_SECONDS)

# The scenario suite: the model's prediction (roce) beside soft-RoCE in the VM lab (rxe); where
# qemu cannot run, the CLI says so and runs the model alone.
RUN_LABS ?= --lab model:roce --lab vm:rxe

run: build
	$(PYTHON) -m rdmalab run $(RUN_LABS) --out $(OUT)

# The scenarios on real kernel drivers: soft-RoCE (rxe) and soft-iWARP (siw) in the VM lab, two
# qemu hosts each, one device at a time (2 cores: four TCG guests at once would starve). Both
# run even when the first fails; the target fails if either did.
VM_DEVICES ?= rxe siw
VM_HOSTS   ?= 2

test-vm: build vmlab-deps
	PYTHONPATH=$(CURDIR) $(PYTHON) -m lab.vmlab prepare
	@rc=0; for d in $(VM_DEVICES); do \
	  echo "== scenarios on vm:$$d ($(VM_HOSTS) hosts)"; \
	  $(PYTEST) tests/scenarios --lab vm:$$d --vm-hosts $(VM_HOSTS) --rdmalab-timeout 180 -rxXs \
	    || rc=1; \
	done; exit $$rc

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

tidy: build
	clang-tidy -p $(BUILD) --quiet $$(git ls-files 'core/*.cc' 'bindings/*.cc' | grep -v _test.cc)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(OUT) bindings/rdmalab/_core*.so
