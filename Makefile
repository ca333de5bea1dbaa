# Two entry points for a fresh machine (Python 3.11, g++, the package index): `make demo`, `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CC_FILES := $(shell find ccsrc -name '*.cc' -o -name '*.h' 2>/dev/null)
STAMP := $(VENV)/.installed

.PHONY: demo test build tsan asan fuzz bench clean

$(STAMP): setup.py pyproject.toml Makefile $(CC_FILES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "setuptools>=68" wheel "pybind11>=2.12"
	$(PY) -m pip install -q --no-build-isolation -e ".[test]"
	touch $(STAMP)

build: $(STAMP)

demo: $(STAMP)
	$(PY) examples/quickstart.py

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup --durations=10 tests

clean:
	rm -rf build *.egg-info mindspore_hyper/_core*.so

# Stress programs of the block store / prefetch scheduler, of the kernel fences / tensor
# mailboxes and of the communication library, under ThreadSanitizer (tsan) and under
# AddressSanitizer + UndefinedBehaviorSanitizer (asan; float-cast-overflow is not part of
# -fsanitize=undefined in GCC, so it is named).
STORE_STRESS_SRCS := ccsrc/tools/store_stress.cc $(wildcard ccsrc/store/*.cc) $(wildcard ccsrc/prefetch/*.cc)
MAILBOX_STRESS_SRCS := ccsrc/tools/mailbox_stress.cc ccsrc/kernels/kernel_fence.cc ccsrc/kernels/tensor_mailbox.cc
COMM_STRESS_SRCS := ccsrc/tools/comm_stress.cc $(wildcard ccsrc/comm/*.cc)
COMM_FUZZ_SRCS := ccsrc/tools/comm_fuzz.cc ccsrc/comm/frame.cc ccsrc/comm/shm_segment.cc ccsrc/comm/types.cc
FUZZ_CORPUS := tests/comm/fuzz_corpus
FUZZ_ITERATIONS ?= 200000
TSAN_FLAGS := -std=c++17 -O1 -g -fsanitize=thread -Wno-tsan -pthread -Iccsrc
ASAN_FLAGS := -std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined,float-cast-overflow \
	-fno-sanitize-recover=all -pthread -Iccsrc
ASAN_ENV := ASAN_OPTIONS="detect_leaks=1:halt_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
tsan:
	mkdir -p build/tsan
	g++ $(TSAN_FLAGS) $(STORE_STRESS_SRCS) -o build/tsan/store_stress
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" build/tsan/store_stress 2000
	g++ $(TSAN_FLAGS) $(MAILBOX_STRESS_SRCS) -o build/tsan/mailbox_stress
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" build/tsan/mailbox_stress 2000
	g++ $(TSAN_FLAGS) $(COMM_STRESS_SRCS) -o build/tsan/comm_stress -lrt
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" build/tsan/comm_stress 3

# Seeded mutation fuzzer of what the comm library reads from peers (frames, headers, counts,
# shared-memory segments) under ASan + UBSan: the corpus unmutated (each file's expected outcome),
# then FUZZ_ITERATIONS mutated inputs (see ccsrc/tools/comm_fuzz.cc).
fuzz:
	mkdir -p build/asan
	g++ $(ASAN_FLAGS) $(COMM_FUZZ_SRCS) -o build/asan/comm_fuzz
	$(ASAN_ENV) build/asan/comm_fuzz $(FUZZ_CORPUS) $(FUZZ_ITERATIONS) 1

asan: fuzz
	mkdir -p build/asan
	g++ $(ASAN_FLAGS) $(STORE_STRESS_SRCS) -o build/asan/store_stress
	$(ASAN_ENV) build/asan/store_stress 2000
	g++ $(ASAN_FLAGS) $(MAILBOX_STRESS_SRCS) -o build/asan/mailbox_stress
	$(ASAN_ENV) build/asan/mailbox_stress 2000
	g++ $(ASAN_FLAGS) $(COMM_STRESS_SRCS) -o build/asan/comm_stress -lrt
	$(ASAN_ENV) build/asan/comm_stress 5

bench-offload: $(STAMP)
	$(PY) benchmarks/bench_offload.py
