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
        prometheus prometheus-pushgateway python3-yaml python3-rpyc nftables clang libclang-rt-14-dev \
        openssh-server openssh-client python3-pytest-xdist

export PYTHONPATH := $(CURDIR)/bindings$(if $(PYTHONPATH),:$(PYTHONPATH))
PYTEST := $(PYTHON) -m pytest -p rdmalab.pytest_plugin

.PHONY: all deps build build-asan test test-cpp test-asan test-python run format tidy clean \
        vmlab-deps vmlab test-vm fuzz test-fuzz bench

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

# The scenario suite on the first table a new user sees: each device of the VM lab (rxe, siw)
# beside the model personality that predicts it (roce, iwarp-siw: the table compares each
# device with its twin), and ib (XRC, QP_FATAL); where qemu cannot run, the CLI says why and
# runs the model's prediction for that device instead.
RUN_LABS ?= --lab model:roce --lab model:iwarp-siw --lab model:ib --lab vm:rxe --lab vm:siw

run: build vmlab-deps
	PYTHONPATH=$(CURDIR) $(PYTHON) -m lab.vmlab prepare || \
	  echo "run: the VM lab's kernel could not be prepared; the CLI falls back to the model"
	$(PYTHON) -m rdmalab run $(RUN_LABS) --out $(OUT)

# The scenarios on real kernel drivers, two qemu hosts each, one device at a time (2 cores:
# four TCG guests at once would starve): rxe through an inventory of guests that `lab.vmlab
# up` boots and that see nothing of this checkout (the agent is shipped to them over SSH, as
# to real machines), then a host lost mid-scenario on those guests (tests/vm); siw through
# `--lab vm:siw`, the one-command path. Each beside the model personality that predicts it
# (roce, iwarp-siw), so pytest's summary compares them ("rdmalab: model vs device"). All run
# even when one fails; the target fails if any did.
VM_HOSTS   ?= 2
INVENTORY  ?= $(CURDIR)/.cache/vmlab/inventory-rxe.toml
VMLAB      := PYTHONPATH=$(CURDIR) $(PYTHON) -m lab.vmlab

test-vm: build vmlab-deps
	$(VMLAB) prepare
	@rc=0; \
	echo "== scenarios on rxe guests as inventory machines ($(INVENTORY))"; \
	if $(VMLAB) up --device rxe --hosts $(VM_HOSTS) --inventory $(INVENTORY); then \
	  $(PYTEST) tests/scenarios --lab model:roce --lab inventory:$(INVENTORY) \
	    --vm-hosts $(VM_HOSTS) --rdmalab-timeout 180 -rxXs || rc=1; \
	  echo "== the same guests: inventory checks and a host lost mid-scenario"; \
	  RDMALAB_INVENTORY=$(INVENTORY) $(PYTEST) tests/vm -rxXs || rc=1; \
	  $(VMLAB) down --inventory $(INVENTORY) || rc=1; \
	else rc=1; fi; \
	echo "== scenarios on vm:siw ($(VM_HOSTS) hosts)"; \
	$(PYTEST) tests/scenarios --lab model:iwarp-siw --lab vm:siw --vm-hosts $(VM_HOSTS) \
	  --rdmalab-timeout 180 -rxXs || rc=1; \
	exit $$rc

# Benchmarks (not part of test): each figure beside a reference measured in the same run
# (perftest on the same rxe pair, a direct link beside the switch, rxe's wall time beside the
# model's), printed as ratios; out/bench/bench.json keeps them. BENCH_ARGS: e.g. --only switch.
BENCH_DEBS := perftest
BENCH_ARGS ?=

bench: build vmlab-deps
	$(call install_missing,$(BENCH_DEBS))
	cmake --build $(BUILD) -j$(JOBS) --target bench-tools
	$(VMLAB) prepare
	PYTHONPATH=$(CURDIR):$(CURDIR)/bindings $(PYTHON) -m bench --build $(BUILD) --out $(OUT)/bench $(BENCH_ARGS)

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

tidy: build
	clang-tidy -p $(BUILD) --quiet $$(git ls-files 'core/*.cc' 'bindings/*.cc' | grep -v _test.cc)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(OUT) bindings/rdmalab/_core*.so
