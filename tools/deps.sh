#!/bin/sh
# deps.sh: install the Debian packages maskserve builds, runs and tests
# with, when missing.  It needs only sh and apt, so it is the first command
# on a fresh machine (`sh tools/deps.sh`, as root); `make run` and
# `make test` call it again and then find nothing to do.
#
# Debian's nginx and redis-server packages start their system services
# (nginx on :80, redis-server on :6379) as they are installed.  The
# project runs its own instances on other ports, so while installing this
# script forbids service starts with a policy-rc.d (unless the machine
# already has one); the services stay enabled and start at the next boot
# (README.md says how to disable them).
#
# python3-*: the client in client/ and its tests (t/50-client.t); torch for
# the replay helper's torch path.
set -e

pkgs="build-essential nginx nginx-dev libhiredis-dev libyajl-dev redis-server
      curl wrk perl libjson-pp-perl clang libclang-rt-dev
      python3 python3-numpy python3-pip python3-setuptools python3-wheel
      python3-torch"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
        || missing="$missing $p"
done

[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "maskserve: missing packages:$missing (run as root to install:" \
         "sh tools/deps.sh)" >&2
    exit 1
fi

policy=/usr/sbin/policy-rc.d
ours=0
if [ ! -e "$policy" ]; then
    ours=1
    printf '#!/bin/sh\n# maskserve tools/deps.sh: no service starts while installing\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT INT TERM
fi

n=$(echo $missing | wc -w)
echo "maskserve: installing $n packages:$missing"
echo "maskserve: this downloads a few hundred MB and takes a few minutes"
export DEBIAN_FRONTEND=noninteractive
echo "maskserve: apt-get update"
apt-get update -q
echo "maskserve: apt-get install"
# one line per package fetched, unpacked and set up: progress in a log too
apt-get install -y -q --no-install-recommends $missing
if [ "$ours" = 1 ]; then
    echo "maskserve: packages installed; Debian's nginx and redis-server" \
         "services were not started (they are enabled for the next boot)"
else
    echo "maskserve: packages installed; $policy decided whether Debian's" \
         "nginx (:80) and redis-server (:6379) services started"
fi
exit 0
