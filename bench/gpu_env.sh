# gpu_env.sh: sourced by the scripts that run on a GPU machine, which has
# no Debian packages.  Unpacks what .debs/ holds (apt-get download
# libyajl2 libyajl-dev, and for the whole stack nginx libhiredis0.14
# redis-server redis-tools liblzf1 libjemalloc2) into /tmp/msv-deb and
# exports the flags and library path that find them.  MSV_DEBS=all
# unpacks every package; by default only yajl, and only when the system
# has none.

deb=/tmp/msv-deb
if [ "${MSV_DEBS:-yajl}" = all ] \
   || ! printf '#include <yajl/yajl_tree.h>\n' | cc -E -x c - >/dev/null 2>&1
then
    mkdir -p "$deb"
    if [ "${MSV_DEBS:-yajl}" = all ]; then
        for f in .debs/*.deb; do dpkg -x "$f" "$deb"; done
    else
        for f in .debs/libyajl*.deb; do dpkg -x "$f" "$deb"; done
    fi
    export CPPFLAGS="-I$deb/usr/include"
    export LDFLAGS="-L$deb/usr/lib/x86_64-linux-gnu"
    export LD_LIBRARY_PATH="$deb/usr/lib/x86_64-linux-gnu"
fi
