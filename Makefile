# accel top-level Makefile: thin wrapper around CMake.
#   make demo    install missing Debian packages, build, run the main example under accel launch
#   make test    install missing packages, build with -Werror, run the unit tests under
#                AddressSanitizer + UndefinedBehaviorSanitizer, then the whole suite (its Python
#                interop tests use a virtual environment in ~/.cache/accel/pyenv, made once:
#                ACCEL_PYENV_DIR moves it, ACCEL_NO_PYTHON=1 skips them; tests/pyenv.sh)
#   make         build only;  make install [PREFIX=/usr/local];  make format;  make clean
BUILD ?= build
ASAN_BUILD ?= build-asan
PREFIX ?= /usr/local
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps build test test-fast test-asan demo bench install format clean

all: build

deps:
	@bash scripts/install-deps.sh

build:
	cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

test: deps
	cmake -S . -B $(BUILD) -DACCEL_WERROR=ON -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)
	cmake -S . -B $(ASAN_BUILD) -DACCEL_WERROR=ON -DACCEL_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ctest -L unit --output-on-failure -j $(JOBS) --timeout 600
	@bash tests/pyenv.sh notice
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: deps build
	$(BUILD)/accel launch --num_processes 2 $(BUILD)/examples/gpt

bench: build
	bash scripts/bench-all.sh $(BUILD) bench-results

install: build
	cmake --install $(BUILD)

format:
	find include src tests examples bench -name '*.[ch]' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
