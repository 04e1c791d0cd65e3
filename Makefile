# maskserve: top-level build.  `make` builds the worker, the client, the
# nginx module and (when nvcc is present) the CUDA kernels; `make test`
# runs every test; `make run` starts the whole stack.  See README.md.

CC       ?= cc
NVCC     ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CFLAGS   ?= -O2 -g
CFLAGS   += -std=gnu11 -Wall -Wextra -Wno-unused-parameter -pthread -fPIC
CPPFLAGS += -D_GNU_SOURCE -Ishm -Iworker
LDLIBS   += -lyajl -lm -lpthread -lrt
B        := build
PORT     ?= 8080
MODEL    ?=

SHM_SRC    := $(wildcard shm/*.c)
WORKER_SRC := $(filter-out worker/main.c,$(wildcard worker/*.c))
CU_SRC     := $(filter-out kernels/kernel_check.cu,$(wildcard kernels/*.cu))
TEST_SRC   := $(wildcard t/c/test_*.c)
BENCH_SRC  := $(wildcard bench/*.c)

SHM_OBJ    := $(SHM_SRC:%.c=$(B)/%.o)
WORKER_OBJ := $(WORKER_SRC:%.c=$(B)/%.o)

ifneq ($(NVCC),)
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVFLAGS    ?= -O2 -g -gencode arch=compute_90,code=sm_90 -Xcompiler -fPIC
CU_OBJ     := $(CU_SRC:%.cu=$(B)/%.o)
CPPFLAGS   += -DMSV_HAVE_CUDA=1 -I$(CUDA_HOME)/include
CUDA_LIBS  := -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/targets/x86_64-linux/lib \
              -lcublasLt -lcublas -lcudart -lstdc++ -Wl,-rpath,$(CUDA_HOME)/lib64
else
CU_OBJ     :=
CUDA_LIBS  :=
endif

LIBS := $(B)/libmsv_worker.a $(B)/libmsv_shm.a

BINS  := $(B)/maskserve-worker $(B)/maskserve-cli $(B)/maskserve-logits
TESTS := $(TEST_SRC:t/c/%.c=$(B)/t/%)
BENCH := $(BENCH_SRC:bench/%.c=$(B)/bench/%)
# packed_bench compiles against nginx's configured headers (`module`):
# the rest builds without nginx's sources (the GPU machine has none)
BENCH_PLAIN := $(filter-out $(B)/bench/packed_bench,$(BENCH))

.PHONY: all bins tests bench module deps test test-asan run clean

include fuzz/fuzz.mk

all: bins module $(B)/bench/packed_bench

bins: $(BINS) tests $(BENCH_PLAIN)

$(B)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(B)/kernels/%.o: kernels/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -Ishm -Iworker -DMSV_HAVE_CUDA=1 -c $< -o $@

# rebuilt from scratch: a source that moved away must not linger inside
$(B)/libmsv_shm.a: $(SHM_OBJ)
	rm -f $@ && $(AR) rcs $@ $^

$(B)/libmsv_worker.a: $(WORKER_OBJ) $(CU_OBJ)
	rm -f $@ && $(AR) rcs $@ $^

$(B)/maskserve-worker: $(B)/worker/main.o $(LIBS)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

$(B)/maskserve-cli: $(B)/tools/maskserve-cli.o $(B)/libmsv_shm.a
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(B)/maskserve-logits: $(B)/tools/maskserve-logits.o $(LIBS)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

tests: $(TESTS)

# the plain-C helpers of the module that tests and benchmarks link
MSV_NGX_SRC := $(wildcard ngx_module/msv_*.c)

# the response checker of the load client and of the tests (documents,
# and whole responses with their SSE splitting), and its test
CHECK_SRC := bench/e2e/array.c bench/e2e/check.c bench/e2e/num.c \
             bench/e2e/lse.c bench/e2e/b64dec.c
RESP_SRC  := $(CHECK_SRC) bench/e2e/resp.c bench/e2e/sse.c bench/e2e/scan.c \
             bench/e2e/fast.c

$(B)/t/test_e2e_check: t/c/test_e2e_check.c $(RESP_SRC) $(RESP_SRC:.c=.h) \
                       $(MSV_NGX_SRC) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -It/c -Ingx_module -Ibench/e2e $(CFLAGS) $(LDFLAGS) -MMD -MP \
	    -o $@ $< $(RESP_SRC) $(wildcard ngx_module/msv_*.c) $(LIBS) \
	    $(CUDA_LIBS) $(LDLIBS)

# the same checker as a program, for the end-to-end tests (t/lib/MsvTest.pm)
$(B)/bench/e2e_check: bench/e2e_check.c $(RESP_SRC) $(RESP_SRC:.c=.h) \
                      $(MSV_NGX_SRC) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Ingx_module -Ibench/e2e $(CFLAGS) $(LDFLAGS) -MMD -MP \
	    -o $@ $< $(RESP_SRC) $(wildcard ngx_module/msv_*.c) $(LIBS) \
	    $(CUDA_LIBS) $(LDLIBS)

# the checker's CPU time per MB of response, compiled as the load client
# is (bench/results/e2e_client.md)
$(B)/bench/e2e_check_bench: bench/e2e_check_bench.c $(RESP_SRC) \
                            $(RESP_SRC:.c=.h) $(MSV_NGX_SRC) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Ingx_module -Ibench/e2e $(CFLAGS) $(LDFLAGS) -O3 -MMD -MP \
	    -o $@ $< $(RESP_SRC) $(wildcard ngx_module/msv_*.c) $(LIBS) \
	    $(CUDA_LIBS) $(LDLIBS)

# the backend suite: with CUDA, also the host-array kernel wrappers
# (kernels/kernel_check.cu), test code linked only here, never into
# libmsv_worker.a
ifneq ($(NVCC),)
KERNEL_CHECK_OBJ := $(B)/kernels/kernel_check.o
endif

$(B)/t/test_backend: t/c/test_backend.c $(KERNEL_CHECK_OBJ) $(MSV_NGX_SRC) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -It/c -Ikernels -Ingx_module $(CFLAGS) $(LDFLAGS) -MMD -MP \
	    -o $@ $< $(KERNEL_CHECK_OBJ) $(wildcard ngx_module/msv_*.c) $(LIBS) \
	    $(CUDA_LIBS) $(LDLIBS)

$(B)/t/%: t/c/%.c $(MSV_NGX_SRC) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -It/c -Ingx_module $(CFLAGS) $(LDFLAGS) -MMD -MP -o $@ $< \
	    $(wildcard ngx_module/msv_*.c) $(LIBS) $(CUDA_LIBS) $(LDLIBS)

bench: $(BENCH)

$(B)/bench/%: bench/%.c $(MSV_NGX_SRC) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Ingx_module $(CFLAGS) $(LDFLAGS) -O3 -MMD -MP -o $@ $< \
	    $(wildcard ngx_module/msv_*.c) $(LIBS) $(CUDA_LIBS) $(LDLIBS)

# the e2e load client is split by concern: bench/e2e/ holds its parts
# (http.c, sse.c, resp.c, load.c, check.c, array.c, and the checker's fast
# path: scan.c, fast.c, num.c, lse.c, b64dec.c); bench/e2e_load.c its
# options
E2E_SRC := $(wildcard bench/e2e/*.c)

$(B)/bench/e2e_load: bench/e2e_load.c $(E2E_SRC) $(wildcard bench/e2e/*.h) \
                     $(MSV_NGX_SRC) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Ingx_module -Ibench/e2e $(CFLAGS) $(LDFLAGS) -O3 -MMD -MP \
	    -o $@ $< $(E2E_SRC) $(wildcard ngx_module/msv_*.c) $(LIBS) $(CUDA_LIBS) \
	    $(LDLIBS)

# the packed-mask benchmark runs the module's output writer as the
# module's build compiles it (-O2, tools/build-module.sh), against nginx's
# configured headers and the core functions of fuzz/ngx_shim.c; `module`
# configures those headers
$(B)/bench/packed_bench: bench/packed_bench.c bench/loopback.h fuzz/ngx_shim.c \
                         ngx_module/ngx_http_maskserve_output.c \
                         $(MSV_NGX_SRC) $(wildcard ngx_module/*.h) | module
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Ishm -Ingx_module -Ifuzz $(NGX_INCS) -O2 -g -Wall -Wextra \
	    -Wno-unused-parameter -MMD -MP \
	    -o $@ bench/packed_bench.c fuzz/ngx_shim.c \
	    ngx_module/ngx_http_maskserve_output.c ngx_module/msv_b64.c \
	    ngx_module/msv_json.c -lm

# The nginx dynamic module, built against Debian's nginx-dev sources.
module:
	+sh tools/build-module.sh $(B)/nginx

deps:
	sh tools/deps.sh

test: deps
	$(MAKE) -j2 all
	MSV_BUILD=$(abspath $(B)) prove $(TESTS) t/*.t

# The C tests and the end-to-end suite with AddressSanitizer and
# UndefinedBehaviorSanitizer in the worker, the tests and the module (the
# stock nginx loads the instrumented module with the ASan runtime
# preloaded).  Its own build directory; CPU backend only.  Any report
# fails the target, including ones from processes the tests killed or
# whose exit status nobody checks: every report goes to $(ASAN_B)/reports.
# Leak checking at exit is off (one-shot tools free nothing on exit; the
# soak watches memory over time instead).  The end-to-end tests are a
# representative subset, to keep CI time down: generation in every mode,
# errors, lifecycle, Redis, limits, disconnects, kills, permissions.
# t/31-reload.t in particular is left out: its 1500-token streams outlast
# the harness's worker_shutdown_timeout at ASan speed; t/61-kill.t reloads
# under load with shorter streams.
ASAN_B      := build-asan
ASAN_FLAGS  := -fsanitize=address,undefined -fno-sanitize-recover=undefined \
               -fno-omit-frame-pointer
ASAN_TESTS  ?= t/05-*.t t/10-*.t t/20-*.t t/30-*.t t/35-*.t t/40-*.t \
               t/60-disconnects.t t/61-kill.t t/64-security.t
ASAN_ENV    := ASAN_OPTIONS=log_path=$(abspath $(ASAN_B))/reports/asan:detect_leaks=0 \
               UBSAN_OPTIONS=log_path=$(abspath $(ASAN_B))/reports/ubsan:print_stacktrace=1:halt_on_error=1

test-asan: deps
	CFLAGS="-O1 -g $(ASAN_FLAGS)" LDFLAGS="$(ASAN_FLAGS)" \
	    $(MAKE) -j2 B=$(ASAN_B) NVCC= $(ASAN_B)/maskserve-worker \
	    $(ASAN_B)/maskserve-cli $(ASAN_B)/bench/e2e_check tests
	MSV_MODULE_CC_OPT="$(ASAN_FLAGS)" MSV_MODULE_LD_OPT="$(ASAN_FLAGS)" \
	    sh tools/build-module.sh $(ASAN_B)/nginx
	printf '#!/bin/sh\n# nginx with the ASan runtime, for the instrumented module\nASAN_OPTIONS="$$ASAN_OPTIONS:detect_leaks=0" LD_PRELOAD=%s exec /usr/sbin/nginx "$$@"\n' \
	    "$$($(CC) -print-file-name=libasan.so)" > $(ASAN_B)/nginx-asan
	chmod +x $(ASAN_B)/nginx-asan
	rm -rf $(ASAN_B)/reports && mkdir -p $(ASAN_B)/reports
	$(ASAN_ENV) MSV_BUILD=$(abspath $(ASAN_B)) \
	    MSV_NGINX=$(abspath $(ASAN_B))/nginx-asan \
	    prove $(TEST_SRC:t/c/%.c=$(ASAN_B)/t/%) $(ASAN_TESTS)
	@if [ -n "$$(ls $(ASAN_B)/reports)" ]; then \
	    echo "sanitizer reports:"; cat $(ASAN_B)/reports/*; exit 1; \
	fi
	@echo "test-asan: no sanitizer reports"

run: deps
	$(MAKE) -j2 all
	B=$(abspath $(B)) MODEL=$(MODEL) PORT=$(PORT) sh tools/run.sh

clean:
	rm -rf $(B) $(ASAN_B)

-include $(shell find $(B) -name '*.d' 2>/dev/null)
