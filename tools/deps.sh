#!/bin/sh
# Install the Debian packages maskserve builds and tests with, when missing.
# (python3-*: the client in client/ and its tests, t/50-client.t; torch
# for the replay helper's torch path.)
set -e

pkgs="build-essential nginx nginx-dev libhiredis-dev libyajl-dev redis-server
      curl wrk perl libjson-pp-perl
      python3 python3-numpy python3-pip python3-setuptools python3-wheel
      python3-torch"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
        || missing="$missing $p"
done

if [ -n "$missing" ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "maskserve: missing packages:$missing (run as root to install)" >&2
        exit 1
    fi
    echo "maskserve: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# Debian starts nginx and redis-server on install; the project runs its
# own instances on other ports, so the system ones are left alone.
exit 0
