#!/usr/bin/perl
# t/60-fleet.t again with each GPU host in its own network namespace
# (ip netns, a veth pair per host, addresses 10.x.<host>.0/24): the front
# and Redis reach the hosts over real interfaces, not loopback.  Needs
# root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2; without them there is
# nothing to run (t/60-fleet.t covers the same on loopback).

use strict;
use warnings;
use FindBin;
use Test::More;

# the probe does what the test does: a namespace and a veth pair into it
my $n = "msvprobe$$";
my $v = "mvp$$";
my $why = $> != 0 ? 'network namespaces need root'
        : system("ip netns add $n 2>/dev/null") != 0
          ? '"ip netns add" is not permitted here'
        : system("ip link add $v type veth peer name ${v}b netns $n 2>/dev/null") != 0
          ? 'veth pairs cannot be made here' : '';
system("ip link del $v 2>/dev/null");
system("ip netns del $n 2>/dev/null");
plan skip_all => $why if $why;

$ENV{MSV_FLEET_NETNS} = 1;
my $file = "$FindBin::Bin/60-fleet.t";
do $file;
die $@ if $@;
