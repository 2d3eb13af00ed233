# accel top-level Makefile: thin wrapper around CMake.
#   make demo    install missing Debian packages, build, train examples/gpt under accel launch
#                (bf16, accumulation, TensorBoard, checkpoints), then resume it (DEMO_DIR)
#   make test    install missing packages, check the layering of includes (scripts/check-layers.sh,
#                DESIGN.md §2), build with -Werror, run the whole suite while the other builds
#                compile in the background (other-builds), then the unit tests under
#                AddressSanitizer + UndefinedBehaviorSanitizer, the same GPU tests on the CUDA
#                emulator (test-cuemu) and the CUDA build's (test-cuda), each as soon as its
#                build is done (the suite's Python
#                interop tests use a virtual environment in ~/.cache/accel/pyenv, made once:
#                ACCEL_PYENV_DIR moves it, ACCEL_NO_PYTHON=1 skips them; tests/pyenv.sh)
#   make test-cuda   where nvcc is on PATH: configure CUDA_BUILD with ACCEL_CUDA=ON, build what
#                the gpu-labelled tests need and run them (each exits 77, skipped, without a
#                GPU), so a broken CUDA build fails CI on machines without GPUs; without nvcc
#                one line says it is skipped
#   make test-cuemu  the CUDA emulator build (CUEMU_BUILD, ACCEL_CUDA_EMU=ON; tests/cuemu): the
#                same CUDA code compiled for the CPU, the NVIDIA libraries replaced by emulators,
#                so the GPU tests run here against the CPU (needs the CUDA headers; skipped
#                with one line without them)
#   make         build only;  make install [PREFIX=/usr/local];  make format;  make clean
BUILD ?= build
ASAN_BUILD ?= build-asan
CUDA_BUILD ?= build-cuda
CUEMU_BUILD ?= build-cuemu
CUDA_INCLUDE ?= $(or $(wildcard $(dir $(shell command -v nvcc 2>/dev/null))../include/cuda_runtime_api.h),$(wildcard /usr/local/cuda/include/cuda_runtime_api.h))
PREFIX ?= /usr/local
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps build test other-builds test-cuda test-cuemu test-fast demo demo-run bench install format clean

all: build

deps:
	@bash scripts/install-deps.sh

build:
	cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

# The sanitizer, emulator and CUDA builds compile, in that order, at nice 19 (scripts/overlap.sh)
# while the main suite runs; then the sanitizer's unit tests run as soon as it is built, the
# emulator's tests as soon as that is (scripts/await.sh), while the builds after them go on
# compiling; the CUDA build's tests last.
test: deps
	bash scripts/check-layers.sh
	cmake -S . -B $(BUILD) -DACCEL_WERROR=ON -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)
	@bash tests/pyenv.sh notice
	@rm -f $(ASAN_DONE) $(CUEMU_DONE)
	@bash scripts/overlap.sh $(BUILD)/other-builds.log "$(MAKE) --no-print-directory other-builds" \
		"(cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600) && \
		bash scripts/await.sh $(ASAN_DONE) && \
		(cd $(ASAN_BUILD) && ctest -L unit --output-on-failure -j $(JOBS) --timeout 600) && \
		bash scripts/await.sh $(CUEMU_DONE) && $(MAKE) --no-print-directory test-cuemu"
	@$(MAKE) --no-print-directory test-cuda

# The other three builds, each configured and built in one command: other-builds runs them
# (make test, in the background), and test-cuda / test-cuemu before their tests.
ASAN_CHECKS_BUILD = cmake -S . -B $(ASAN_BUILD) -DACCEL_WERROR=ON -DACCEL_SANITIZE=ON \
	-DCMAKE_BUILD_TYPE=Debug $(CMAKE_FLAGS) && cmake --build $(ASAN_BUILD) -j $(JOBS) --target unit_checks
CUDA_CHECKS_BUILD = cmake -S . -B $(CUDA_BUILD) -DACCEL_WERROR=ON -DACCEL_CUDA=ON $(CMAKE_FLAGS) && \
	cmake --build $(CUDA_BUILD) -j $(JOBS) --target gpu_checks
CUEMU_CHECKS_BUILD = cmake -S . -B $(CUEMU_BUILD) -DACCEL_WERROR=ON -DACCEL_CUDA=ON -DACCEL_CUDA_EMU=ON \
	$(CMAKE_FLAGS) && cmake --build $(CUEMU_BUILD) -j $(JOBS) --target gpu_checks
HAVE_NVCC = command -v nvcc >/dev/null 2>&1

# Made by other-builds as each build is done (or skipped), for make test's scripts/await.sh.
ASAN_DONE = $(BUILD)/other-builds.asan-done
CUEMU_DONE = $(BUILD)/other-builds.cuemu-done

# Configures and builds what the ASan+UBSan unit tests, test-cuemu and test-cuda run.
other-builds:
	$(ASAN_CHECKS_BUILD)
	@mkdir -p $(BUILD) && touch $(ASAN_DONE)
	@if [ -n "$(CUDA_INCLUDE)" ]; then $(CUEMU_CHECKS_BUILD); fi
	@touch $(CUEMU_DONE)
	@if $(HAVE_NVCC); then $(CUDA_CHECKS_BUILD); fi

test-cuda:
	@if $(HAVE_NVCC); then \
		$(CUDA_CHECKS_BUILD) && \
		cd $(CUDA_BUILD) && ctest -L gpu --output-on-failure -j $(JOBS) --timeout 600; \
	else \
		echo "make test: nvcc is not on PATH, so the CUDA build (ACCEL_CUDA=ON) is not compiled"; \
	fi

test-cuemu:
	@if [ -n "$(CUDA_INCLUDE)" ]; then \
		$(CUEMU_CHECKS_BUILD) && \
		cd $(CUEMU_BUILD) && ctest -L 'gpu|cuemu' --output-on-failure -j $(JOBS) --timeout 600; \
	else \
		echo "make test: no CUDA headers (cuda_runtime_api.h), so the CUDA emulator build is not run"; \
	fi

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The demo: what README leads with, in about a minute on 2 cores. Part 1 trains in bf16 with
# gradient accumulation, logs to TensorBoard and saves a checkpoint every DEMO_STEPS/4 steps,
# and stops halfway as if interrupted; part 2, the same command with --resume, continues from
# the newest checkpoint to the end. Everything it writes is in DEMO_DIR. demo-run runs it on
# an existing build (tests/examples/test_demo.sh runs a tiny one, with DEMO_ARGS).
DEMO_DIR ?= $(BUILD)/demo
DEMO_STEPS ?= 200
DEMO_ARGS ?=
DEMO_RUN = $(BUILD)/accel launch --num_processes 2 $(BUILD)/examples/gpt --mixed_precision bf16 \
	--accum 2 --steps $(DEMO_STEPS) --log_every $(shell expr $(DEMO_STEPS) / 8) \
	--log_with tensorboard --project_dir $(DEMO_DIR) \
	--checkpoint_every $(shell expr $(DEMO_STEPS) / 4) --total_limit 2 $(DEMO_ARGS)

demo: deps build
	@$(MAKE) --no-print-directory demo-run

demo-run:
	@rm -rf $(DEMO_DIR)
	@echo "== demo 1/2: bf16, gradient accumulation 2, TensorBoard, checkpoints; stops halfway"
	$(DEMO_RUN) --stop_at $(shell expr $(DEMO_STEPS) / 2) --sample 0
	@echo "== demo 2/2: the same command with --resume continues from the newest checkpoint"
	$(DEMO_RUN) --resume

bench: build
	bash scripts/bench-all.sh $(BUILD) bench-results

install: build
	cmake --install $(BUILD)

format:
	find include src tests examples bench -name '*.[ch]' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(CUDA_BUILD) $(CUEMU_BUILD)
