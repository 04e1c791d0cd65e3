#!/bin/sh
# build-module.sh OUTDIR: build ngx_http_maskserve_module.so against the
# distribution's nginx sources (Debian's nginx-dev, /usr/share/nginx/src),
# so that the stock nginx binary can load it with load_module.
#
# The sources are copied to OUTDIR/src and configured with the same flags
# the nginx binary was built with (conf_flags).  Re-running is
# incremental: configure runs again only when `config`, the set of module
# sources or the distribution's sources change.

if [ -z "$BASH_VERSION" ]; then
    # conf_flags defines a bash array
    exec bash "$0" "$@"
fi

set -e -o pipefail

NGX_SRC=${NGX_SRC:-/usr/share/nginx/src}

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)

if [ ! -f "$NGX_SRC/conf_flags" ] || [ ! -x "$NGX_SRC/configure" ]; then
    echo "$0: $NGX_SRC/conf_flags or configure missing" \
         "(Debian: apt-get install nginx-dev)" >&2
    exit 1
fi

# The optimization level of the distribution's nginx binary: Debian
# builds it with --with-cc-opt='-g -O2 ...' (nginx -V), which conf_flags
# does not carry, so that configure alone compiles with -O (gcc's -O1):
# the module's float32 formatting then runs at about 30 M/s instead of
# 50 (bench/results/packed.md, "Formatting inside nginx").
# MSV_MODULE_OPT overrides it (MSV_MODULE_OPT=-O restores the old build).
# Extra compiler and linker options for the module follow it (make
# test-asan builds it with the sanitizers this way).
extra=("--with-cc-opt=${MSV_MODULE_OPT--O2}${MSV_MODULE_CC_OPT:+ $MSV_MODULE_CC_OPT}")
if [ -n "${MSV_MODULE_LD_OPT:-}" ]; then
    extra+=("--with-ld-opt=$MSV_MODULE_LD_OPT")
fi

# What configure depends on: the addon script, the list of sources it
# globs, the distribution's flags and its version, the extra options.
stamp=$( (cat "$repo/config" "$NGX_SRC/conf_flags"; echo "${extra[*]:-}";
          cd "$repo" && ls shm/*.c shm/*.h ngx_module/*.c ngx_module/*.h;
          ls -l --time-style=+%s "$NGX_SRC/src/core/nginx.h") 2>/dev/null \
        | sha256sum | cut -d' ' -f1)

if [ -f "$out/src/objs/Makefile" ] && [ -f "$out/config.stamp" ] \
   && [ "$(cat "$out/config.stamp")" = "$stamp" ]
then
    echo "build-module: configuration unchanged, building incrementally"
else
    echo "build-module: configuring against $NGX_SRC"
    rm -rf "$out/src" "$out/config.stamp"
    cp -a "$NGX_SRC" "$out/src"

    cd "$out/src"
    . ./conf_flags
    ./configure "${NGX_CONF_FLAGS[@]}" ${extra[@]+"${extra[@]}"} \
        --add-dynamic-module="$repo" \
        > "$out/configure.log" 2>&1 \
        || { tail -n 30 "$out/configure.log" >&2;
             echo "$0: configure failed, see $out/configure.log" >&2;
             exit 1; }
    echo "$stamp" > "$out/config.stamp"
fi

cd "$out/src"
make -f objs/Makefile modules

so="$out/src/objs/ngx_http_maskserve_module.so"
if [ ! -f "$so" ]; then
    echo "$0: $so was not built" >&2
    exit 1
fi

echo "$so"
