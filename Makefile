# Two entry points for a fresh machine (Python 3.11, g++, the package index): `make demo`, `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CC_FILES := $(shell find ccsrc -name '*.cc' -o -name '*.h' 2>/dev/null)
STAMP := $(VENV)/.installed

.PHONY: demo test build tsan bench clean

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
	$(PY) -m pytest -q -p no:cacheprovider tests

clean:
	rm -rf build *.egg-info mindspore_hyper/_core*.so

# HyperOffload: the stress programs of the block store / prefetch scheduler and of the kernel
# fences / tensor mailboxes, under ThreadSanitizer.
TSAN_SRCS := ccsrc/tools/store_stress.cc $(wildcard ccsrc/store/*.cc) $(wildcard ccsrc/prefetch/*.cc)
TSAN_MAILBOX_SRCS := ccsrc/tools/mailbox_stress.cc ccsrc/aot/kernel_fence.cc ccsrc/aot/tensor_mailbox.cc
TSAN_FLAGS := -std=c++17 -O1 -g -fsanitize=thread -Wno-tsan -pthread -Iccsrc
tsan:
	mkdir -p build/tsan
	g++ $(TSAN_FLAGS) $(TSAN_SRCS) -o build/tsan/store_stress
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" build/tsan/store_stress 2000
	g++ $(TSAN_FLAGS) $(TSAN_MAILBOX_SRCS) -o build/tsan/mailbox_stress
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" build/tsan/mailbox_stress 2000

bench-offload: $(STAMP)
	$(PY) benchmarks/bench_offload.py
