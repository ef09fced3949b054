# rdmalab: make deps | build | test | run. Debian 12; Python is /usr/bin/python3 (the python3
# first on PATH may be another interpreter that lacks python3-pybind11 / python3-pytest).

PYTHON     ?= /usr/bin/python3
JOBS       ?= 2
BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_SECONDS ?= 60
LAB        ?= model
OUT        ?= out

DEBS := build-essential cmake ninja-build g++ ccache libgtest-dev googletest nlohmann-json3-dev \
        pybind11-dev python3-dev python3-pybind11 python3-pytest python3-execnet \
        libibverbs-dev librdmacm-dev pkg-config prometheus-cpp-dev \
        prometheus prometheus-pushgateway python3-yaml python3-rpyc nftables clang libclang-rt-14-dev \
        openssh-server openssh-client python3-pytest-xdist python3-jinja2

export PYTHONPATH := $(CURDIR)/bindings$(if $(PYTHONPATH),:$(PYTHONPATH))

# What rdmalab keeps between clones on this machine, outside any clone: the compiler cache here,
# the VM lab's kernels and modules (bindings/rdmalab/machines/vmlab/cache.py: $(RDMALAB_CACHE)/vmlab unless VMLAB_CACHE
# is set; both follow XDG_CACHE_HOME).
RDMALAB_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/rdmalab
# Debian's ccache: a second clone, or CI on the same machine, compiles only what changed.
# BASEDIR and NOHASHDIR let clones at different paths share results (the debug info then names
# the folder of the clone that compiled first).
export CCACHE_DIR ?= $(RDMALAB_CACHE)/ccache
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := true
export CCACHE_MAXSIZE ?= 5G
# cmake's configure step, with ccache as the compiler launcher once `make deps` installed it.
CONFIGURE = cmake -S . -G Ninja $$(command -v ccache >/dev/null && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# The sanitizer builds use clang: it compiles them in half of g++'s time here, and libFuzzer
# (clang's) shares the ASan+UBSan build.
SAN_CXX := -DCMAKE_CXX_COMPILER=clang++
PYTEST := $(PYTHON) -m pytest -p rdmalab.run.pytest_plugin

.PHONY: all deps build build-asan test test-cpp test-asan test-python run format tidy clean \
        vmlab-deps vmlab test-vm fuzz test-fuzz bench \
        build-module build-tsan test-tsan test-tsan-vm vmlab-prepare test-vm-rxe test-vm-siw \
        test-netns test-matrix test-ulp test-container test-browser

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

# The soft-RoCE VM lab (bindings/rdmalab/machines/vmlab, docs/vmlab.md): its host packages, then the kernel, siw.ko and
# initrd (cached in $(RDMALAB_CACHE)/vmlab, shared by every clone; bindings/rdmalab/machines/vmlab/cache.py), then two
# qemu hosts per provider running rping/pingpong.
VMLAB_DEBS := $(shell grep -v '^\s*\#' bindings/rdmalab/machines/vmlab/deps.txt 2>/dev/null)

vmlab-deps:
	$(call install_missing,$(VMLAB_DEBS))

vmlab: vmlab-deps
	$(PYTHON) -m rdmalab.machines.vmlab prepare
	$(PYTHON) -m rdmalab.machines.vmlab selftest

# $(call needs,PREREQS): PREREQS, except when tests/phases.py runs a target (PHASE=1): it has
# already run them, in its own order, and two ninjas must never share one build folder.
needs = $(if $(PHASE),,$(1))

# all, and the benchmark tools (small; tests/python checks that they still measure).
build: $(call needs,deps)
	$(CONFIGURE) -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(BUILD) -j$(JOBS) --target all bench-tools

# What the scenarios need from the normal build: the Python module and the fault switch (the
# VM lab starts while the GoogleTest binaries still build).
build-module: $(call needs,deps)
	$(CONFIGURE) -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(BUILD) -j$(JOBS) --target _core rdmalab-switch

# The engine and its GoogleTest tests under AddressSanitizer + UBSan (no Python module), at
# -O1 -g1 with asserts on (CMakeLists.txt), with clang; the switch's libFuzzer target is built
# in the same tree from the same objects (faults/CMakeLists.txt).
build-asan: $(call needs,deps)
	$(CONFIGURE) -B $(ASAN_BUILD) $(SAN_CXX) -DCMAKE_BUILD_TYPE= \
	  -DRDMALAB_SANITIZE=address -DRDMALAB_FUZZ=ON -DRDMALAB_PYTHON=OFF
	cmake --build $(ASAN_BUILD) -j$(JOBS)

# ThreadSanitizer over the multi-threaded layers: the runtimes (the model's SimRuntime is in
# the model tests, the real one in the verbs tests), the stack and the verbs backend.
TSAN_BUILD ?= build-tsan
TSAN_TESTS := rdmalab_model_tests rdmalab_stack_tests rdmalab_verbs_tests

build-tsan: $(call needs,deps)
	$(CONFIGURE) -B $(TSAN_BUILD) $(SAN_CXX) -DCMAKE_BUILD_TYPE= \
	  -DRDMALAB_SANITIZE=thread -DRDMALAB_PYTHON=OFF
	cmake --build $(TSAN_BUILD) -j$(JOBS) --target $(TSAN_TESTS)

# The switch's frame parser, rule matcher and corrupter under libFuzzer + ASan/UBSan (clang,
# the ASan build's objects), for FUZZ_SECONDS on a seed corpus of real and built frames; a
# crash fails the target and leaves crash-* in $(ASAN_BUILD).
fuzz: $(call needs,build-asan)
	$(ASAN_BUILD)/faults/rdmalab_fuzz_corpus $(ASAN_BUILD)/corpus
	cd $(ASAN_BUILD) && ./faults/rdmalab_fuzz_frame -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	  -print_final_stats=1 corpus

test-cpp: $(call needs,build)
	ctest --test-dir $(BUILD) -j$(JOBS) --output-on-failure

test-asan: $(call needs,build-asan)
	ctest --test-dir $(ASAN_BUILD) -j$(JOBS) --output-on-failure

# halt_on_error: the first race fails the run; the binaries run one at a time (their tests
# start threads of their own).
test-tsan: $(call needs,build-tsan)
	@rc=0; for t in $(TSAN_TESTS); do \
	  echo "== $$t (ThreadSanitizer)"; \
	  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 $(TSAN_OPTIONS)" \
	    $(TSAN_BUILD)/core/$$t --gtest_brief=1 || rc=1; \
	done; exit $$rc

# The verbs tests that need a device, under TSan, in one rxe guest and one siw guest (guests of
# rdmalab.machines.vmlab boot see the host's tree): the backend's event and CM threads against real drivers.
TSAN_VM_CMD := TSAN_OPTIONS='halt_on_error=1 second_deadlock_stack=1' \
  $(CURDIR)/$(TSAN_BUILD)/core/rdmalab_verbs_tests --gtest_brief=1

test-tsan-vm: $(call needs,build-tsan vmlab-prepare)
	@rc=0; for dev in rxe siw; do \
	  echo "== rdmalab_verbs_tests (ThreadSanitizer) on $$dev in a VM"; \
	  $(VMLAB) boot -n 1 --rdma $$dev --timeout 300 "$(TSAN_VM_CMD)" || rc=1; \
	done; exit $$rc

# tests/python on two pytest-xdist workers: much of it waits (ssh, subprocesses, deadlines), so
# two take about 60 of its 90 s alone and catch up faster beside the guests.
test-python: $(call needs,build)
	$(PYTEST) -n 2 tests/python --lab $(LAB)
	$(PYTEST) tests/scenarios tests/metrics --lab $(LAB)

# The swarm (issue 17): a bounded run on the model (SWARM_MINUTES, every personality in turn,
# every checker on every seed; a failing seed's schedule, shrunk form and replay command land in
# $(OUT)/swarm), then the mutation test: each planted defect found and shrunk to <= 5 steps.
SWARM_MINUTES ?= 1

test-swarm: $(call needs,build)
	RDMALAB_SWARM_MINUTES=$(SWARM_MINUTES) RDMALAB_SWARM_OUT=$(abspath $(OUT))/swarm \
	  $(PYTEST) tests/swarm -rs

# The switch's fuzz target, bounded, as part of `test` (make fuzz for a longer run).
TEST_FUZZ_SECONDS ?= 30

test-fuzz: $(call needs,build-asan)
	$(MAKE) fuzz FUZZ_SECONDS=$(TEST_FUZZ_SECONDS)

# Every suite, in lanes (tests/phases.py): the VM lab's scenarios start as soon as the Python
# module is built; beside them the other builds (niced: the guests' timers come first) and
# suites. Each phase's output goes to $(OUT)/test-phases/<phase>.log (the VM lane's also to the
# terminal); at the end the failed phases' logs and a per-phase time breakdown are printed. All
# phases run even when one fails. The VM labs run in two lanes, rxe beside siw then netns: most
# of a device scenario is kernel timers and round trips, and with the idle agents asleep
# (docs/DESIGN.md) two labs keep the 2 cores busy where one left about a quarter of them idle; every
# wait and timing bound counts the stalls this costs (lab.stalled_ns). Not three: at two the
# cores are already 94% busy. The sanitizer builds have a lane of their own (san), niced, so
# on a cold cache they compile in what the guests leave instead of one after the other at the
# end of the side lane (its last 300 s had the cores half idle); their tests wait for
# test-python to end (done=: whatever its result), as they did in the side lane: run beside
# the guests' first minutes, a second run took 874 s instead of 651-705 s. TSan is built first: test-tsan-vm waits for it.
# test-browser waits for test-vm-siw's report (done=: also after a failed run, whose report
# matters most).
TEST_PHASES := \
  vm:build-module:ninja=$(BUILD) \
  side:vmlab-prepare \
  vm:test-vm-rxe:after=build-module,vmlab-prepare:junit=$(OUT)/vm-rxe/junit.xml,$(OUT)/vm-rxe/junit-vm.xml \
  vm2:test-vm-siw:after=build-module,vmlab-prepare:junit=$(OUT)/vm-siw/junit.xml \
  vm2:test-netns:after=build-module,vmlab-prepare:junit=$(OUT)/netns/junit.xml \
  vm:test-tsan-vm:after=build-tsan \
  side:build:nice:after=build-module:ninja=$(BUILD) \
  side:test-cpp:after=build \
  side:test-python:after=build \
  side:test-swarm:nice:after=build \
  side:test-browser:nice:done=test-vm-siw \
  san:build-tsan:nice:after=build-module:ninja=$(TSAN_BUILD) \
  san:build-asan:nice:ninja=$(ASAN_BUILD) \
  san:test-tsan:after=build-tsan:done=test-python \
  san:test-asan:after=build-asan \
  san:test-fuzz:nice:after=build-asan

test: deps vmlab-deps
	$(PYTHON) tests/phases.py --make "$(MAKE)" --out $(OUT)/test-phases $(TEST_PHASES)

# The scenario suite on the first table a new user sees: each device of the VM lab (rxe, siw)
# beside the model personality that predicts it (roce, iwarp-siw: the table compares each
# device with its twin), and ib (XRC, QP_FATAL); where qemu cannot run, the CLI says why and
# runs the model's prediction for that device instead.
RUN_LABS ?= --lab model:roce --lab model:iwarp-siw --lab model:ib --lab vm:rxe --lab vm:siw

run: build vmlab-deps
	$(PYTHON) -m rdmalab.machines.vmlab prepare || \
	  echo "run: the VM lab's kernel could not be prepared; the CLI falls back to the model"
	@echo "$(PYTHON) -m rdmalab run $(RUN_LABS) --out $(OUT)"; \
	rc=0; $(PYTHON) -m rdmalab run $(RUN_LABS) --out $(OUT) || rc=$$?; \
	$(call report_at,$(OUT)); exit $$rc

# $(call report_at,DIR): where a run's report is, as a URL to open (`rdmalab run` has printed
# its path already; this line also comes when the run failed before writing one).
report_at = if [ -f $(1)/report.html ]; then echo "report: file://$(abspath $(1))/report.html"; \
	else echo "report: none written ($(1)/report.html is missing)"; fi

# The scenarios on real kernel drivers, two qemu hosts each, one device at a time (2 cores:
# four TCG guests at once would starve): rxe through an inventory of guests that `rdmalab.machines.vmlab
# up` boots and that see nothing of this checkout (the agent is shipped to them over SSH, as
# to real machines), then a host lost mid-scenario on those guests (tests/vm); siw through
# `--lab vm:siw`, the one-command path (`rdmalab run`: its report, $(OUT)/vm-siw/report.html,
# is what test-browser opens). Each beside the model personality that predicts it (roce,
# iwarp-siw), so pytest's summary compares them ("rdmalab: model vs device"). All run even when
# one fails; the target fails if any did.
#
# VM_SYSCTL: sysctls the guests boot with. net.ipv4.tcp_syn_retries=2 makes siw's
# never-answered connect give up after 7 s instead of 127 s; the caps read the sysctl, so
# the scenario predicts 7 s there, while the model twin beside it keeps Linux's default 6
# (127 s of virtual time): the long wait is covered by the model, the device runs the short one.
# Each device lab's histories and evidence bundles (capture, rdma res, kernel logs: the
# kernel-log oracle) stay in $(OUT)/vm-rxe, $(OUT)/vm-siw and $(OUT)/netns.
VM_HOSTS   ?= 2
INVENTORY  ?= $(CURDIR)/.cache/vmlab/inventory-rxe.toml
VM_SYSCTL  ?= net.ipv4.tcp_syn_retries=2
VMLAB      := $(PYTHON) -m rdmalab.machines.vmlab
VM_PYTEST  := RDMALAB_VM_SYSCTL="$(VM_SYSCTL)" $(PYTEST)

vmlab-prepare: $(call needs,vmlab-deps)
	$(VMLAB) prepare
	$(VMLAB) --kernel $(NETNS_KERNEL) prepare --no-siw

test-vm-rxe: $(call needs,build-module vmlab-prepare)
	@rc=0; \
	echo "== scenarios on rxe guests as inventory machines ($(INVENTORY))"; \
	if RDMALAB_VM_SYSCTL="$(VM_SYSCTL)" $(VMLAB) up --device rxe --hosts $(VM_HOSTS) \
	    --inventory $(INVENTORY); then \
	  $(VM_PYTEST) tests/scenarios --lab model:roce --lab inventory:$(INVENTORY) \
	    --vm-hosts $(VM_HOSTS) --rdmalab-timeout 180 -rxXs \
	    --history-dir $(OUT)/vm-rxe/history --junitxml $(OUT)/vm-rxe/junit.xml || rc=1; \
	  echo "== the same guests: inventory checks and a host lost mid-scenario"; \
	  RDMALAB_INVENTORY=$(INVENTORY) $(VM_PYTEST) tests/vm -rxXs \
	    --junitxml $(OUT)/vm-rxe/junit-vm.xml || rc=1; \
	  $(VMLAB) down --inventory $(INVENTORY) || rc=1; \
	else rc=1; fi; \
	exit $$rc

test-vm-siw: $(call needs,build-module vmlab-prepare)
	@echo "== scenarios on vm:siw ($(VM_HOSTS) hosts), written to $(OUT)/vm-siw"
	@rc=0; RDMALAB_VM_SYSCTL="$(VM_SYSCTL)" $(PYTHON) -m rdmalab run --lab model:iwarp-siw \
	  --lab vm:siw --vm-hosts $(VM_HOSTS) --timeout 180 --out $(OUT)/vm-siw -- -rfEsxX || rc=$$?; \
	$(call report_at,$(OUT)/vm-siw); exit $$rc

# The report of test-vm-siw's run in headless Chromium (tests/browser): the matrix and each
# ladder rendered (arrows counted against the histories), a screenshot in $(OUT)/browser.
BROWSER_DEBS := chromium

test-browser:
	$(call install_missing,$(BROWSER_DEBS))
	RDMALAB_REPORT_DIR=$(abspath $(OUT))/vm-siw RDMALAB_SCREENSHOT=$(abspath $(OUT))/browser/report.png \
	  $(PYTEST) tests/browser -rs

# The netns lab (bindings/rdmalab/machines/netns/): NETNS_HOSTS hosts as network namespaces on one kernel, rxe in
# each. This machine's kernel has no rxe, so they live inside one guest booted with
# NETNS_KERNEL (rxe works per network namespace since 7.1). Beside the model twin.
NETNS_KERNEL ?= sid
NETNS_HOSTS  ?= 2

test-netns: $(call needs,build-module vmlab-prepare)
	@echo "== scenarios on netns:rxe ($(NETNS_HOSTS) namespaces in one $(NETNS_KERNEL) guest)"
	$(VM_PYTEST) tests/scenarios --lab model:roce --lab netns:rxe --kernel $(NETNS_KERNEL) \
	  --vm-hosts $(NETNS_HOSTS) --rdmalab-timeout 180 -rxXs --history-dir $(OUT)/netns/history \
	  --junitxml $(OUT)/netns/junit.xml

# The suite on each VM lab device (rxe, siw) and guest kernel (bookworm 6.1, trixie 6.12, sid
# 7.2): out/matrix/matrix.md, the table README's "Kernel matrix" quotes (copy it there with
# `python3 -m rdmalab matrix --table-only --out out/matrix --readme README.md`). Not in test.
MATRIX_ARGS ?=

test-matrix: build vmlab-deps
	$(VMLAB) prepare
	RDMALAB_VM_SYSCTL="$(VM_SYSCTL)" $(PYTHON) -m rdmalab matrix --out $(OUT)/matrix $(MATRIX_ARGS)

# Every workload (kernel ULP) against every fault kind on the VM lab's rxe and siw (tests/ulp):
# out/ulp/ulp.md, the table of workload x fault x device with the recovery times that README's
# "Kernel ULPs under faults" quotes (copy it there with
# `python3 -m rdmalab ulp --table-only --out out/ulp --readme README.md`). Not in test.
ULP_ARGS ?=

test-ulp: build vmlab-deps
	$(VMLAB) prepare
	RDMALAB_VM_SYSCTL="$(VM_SYSCTL)" $(PYTHON) -m rdmalab ulp --out $(OUT)/ulp $(ULP_ARGS)

# The lab's hosts as podman containers sharing this machine's kernel (bindings/rdmalab/machines/container): the image
# from debootstrap and `podman import` (no registry), CONTAINER_HOSTS hosts on network
# namespaces, each driven through the agent (bindings/rdmalab/machines/container/smoke.py). This kernel has no RDMA,
# so no device is shown here (rxe in containers needs Linux 7.1: the netns lab is the tested
# RDMA path). Not in test.
CONTAINER_DEBS  := podman crun runc debootstrap
CONTAINER_HOSTS ?= 2

test-container: build
	$(call install_missing,$(CONTAINER_DEBS))
	bindings/rdmalab/machines/container/build.sh
	@rc=0; bindings/rdmalab/machines/container/hosts.sh start $(CONTAINER_HOSTS) && \
	  $(PYTHON) -m rdmalab.machines.container.smoke $(CONTAINER_HOSTS) || rc=1; \
	bindings/rdmalab/machines/container/hosts.sh stop || rc=1; exit $$rc

test-vm: $(call needs,build-module vmlab-deps)
	@rc=0; $(MAKE) --no-print-directory test-vm-rxe || rc=1; \
	$(MAKE) --no-print-directory test-vm-siw || rc=1; exit $$rc

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
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) build-fuzz $(OUT) bindings/rdmalab/_core*.so
