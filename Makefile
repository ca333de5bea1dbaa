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

# HyperOffload: the block store / prefetch scheduler stress program under ThreadSanitizer.
TSAN_SRCS := ccsrc/tools/store_stress.cc $(wildcard ccsrc/store/*.cc) $(wildcard ccsrc/prefetch/*.cc)
tsan:
	mkdir -p build/tsan
	g++ -std=c++17 -O1 -g -fsanitize=thread -Wno-tsan -pthread -Iccsrc $(TSAN_SRCS) -o build/tsan/store_stress
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" build/tsan/store_stress 2000

bench-offload: $(STAMP)
	$(PY) benchmarks/bench_offload.py
