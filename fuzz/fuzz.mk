# fuzz/fuzz.mk: libFuzzer targets (make fuzz; see docs/reliability.md).
# Included by the top-level Makefile; $(B) is its build directory.
#
# Each target is built with clang -fsanitize=fuzzer,address,undefined and
# links the project's sources compiled the same way.  The parser target
# also needs nginx's configured headers (ngx_auto_config.h), which
# `make module` writes to $(B)/nginx/src/objs.

FUZZ_CC     ?= clang
FUZZ_B      := $(B)/fuzz
FUZZ_SAN    := -fsanitize=fuzzer,address,undefined \
               -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS := -std=gnu11 -O1 -g -D_GNU_SOURCE $(FUZZ_SAN) \
               -Ishm -Iworker -Ingx_module -Ifuzz
FUZZ_TIME   ?= 5
FUZZ_NAMES  := parse json ring safetensors b64
FUZZ_BINS   := $(FUZZ_NAMES:%=$(FUZZ_B)/fuzz_%)

NGX_HDRS    ?= /usr/share/nginx/src
NGX_OBJS    ?= $(B)/nginx/src/objs
NGX_INCS    := -I$(NGX_HDRS)/src/core -I$(NGX_HDRS)/src/event \
               -I$(NGX_HDRS)/src/event/modules -I$(NGX_HDRS)/src/os/unix \
               -I$(NGX_OBJS) -I$(NGX_HDRS)/src/http \
               -I$(NGX_HDRS)/src/http/modules -I$(NGX_HDRS)/src/http/v2

.PHONY: fuzz fuzz-check

fuzz: $(FUZZ_BINS)

$(FUZZ_B)/fuzz_parse: fuzz/fuzz_parse.c fuzz/ngx_shim.c \
                      ngx_module/ngx_http_maskserve_parse.c shm/msv_params.c \
                      | $(NGX_OBJS)/ngx_auto_config.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(NGX_INCS) -o $@ $^ -lyajl -lm

$(FUZZ_B)/fuzz_json: fuzz/fuzz_json.c ngx_module/msv_json.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $^ -lm

$(FUZZ_B)/fuzz_ring: fuzz/fuzz_ring.c shm/msv_ring.c shm/msv_region.c \
                     ngx_module/msv_json.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $^ -lm

$(FUZZ_B)/fuzz_safetensors: fuzz/fuzz_safetensors.c worker/safetensors.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $^ -lyajl -lm

$(FUZZ_B)/fuzz_b64: fuzz/fuzz_b64.c ngx_module/msv_b64.c t/c/b64_ref.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -It/c -o $@ $(filter %.c,$^)

$(NGX_OBJS)/ngx_auto_config.h:
	+sh tools/build-module.sh $(B)/nginx

# A short run of each target over its committed corpus (CI): FUZZ_TIME
# seconds each; new inputs go to a scratch directory, not the corpus.
fuzz-check: $(FUZZ_BINS)
	@for n in $(FUZZ_NAMES); do \
	    rm -rf $(FUZZ_B)/new-$$n && mkdir -p $(FUZZ_B)/new-$$n && \
	    $(FUZZ_B)/fuzz_$$n -max_total_time=$(FUZZ_TIME) -print_final_stats=1 \
	        $(FUZZ_B)/new-$$n fuzz/corpus/$$n > $(FUZZ_B)/fuzz_$$n.log 2>&1 \
	    || { tail -n 40 $(FUZZ_B)/fuzz_$$n.log; exit 1; }; \
	    echo "fuzz_$$n: $$(grep -o 'number_of_executed_units: [0-9]*' \
	        $(FUZZ_B)/fuzz_$$n.log) in $(FUZZ_TIME) s, no crash"; \
	done
