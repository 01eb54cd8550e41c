# Thin wrapper over CMake: the README quick start is `make demo` and `make test`.
BUILD ?= build
CUDA ?= AUTO
SANITIZE ?= OFF
JOBS ?= $(shell nproc)
# No "Entering/Leaving directory" lines around every step of the CMake build.
MAKEFLAGS += --no-print-directory
CMAKE_FLAGS ?=

.PHONY: all bootstrap configure build test demo clean

all: build

bootstrap:
	@scripts/bootstrap.sh

configure: bootstrap
	cmake -S . -B $(BUILD) -DFREEKV_CUDA=$(CUDA) -DFREEKV_SANITIZE=$(SANITIZE) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	@nvidia-smi -L >/dev/null 2>&1 || echo "note: no CUDA device is visible (nvidia-smi -L fails):" \
	  "the gpu-labelled tests will report Skipped; they run where a device is"
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

demo: build
	scripts/demo.sh $(BUILD)

clean:
	rm -rf $(BUILD)
