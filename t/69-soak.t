#!/usr/bin/perl
# The soak, shortened for CI: bench/soak.pl for MSV_SOAK_SECONDS (120)
# with 64 concurrent mixed requests; every answer is checked against the
# one recorded alone, slots and KV cache must end free and private memory
# flat.  docs/reliability.md records the long run.

use strict;
use warnings;
use FindBin;
use Test::More;

my $secs = $ENV{MSV_SOAK_SECONDS} // 120;
my $out = `perl $FindBin::Bin/../bench/soak.pl --seconds $secs --conc 64 --sample 5 2>&1`;
my $st = $?;
diag($out) if $st != 0 || $ENV{TEST_VERBOSE};
like($out, qr/^soak: \d+ s, 64 clients, [1-9]\d* answers checked .* 0 bad$/m,
     'every answer of the soak was intact');
like($out, qr/^after: slots all free, KV tokens free (\d+) of \1$/m,
     'slots and KV cache free afterwards');
unlike($out, qr/\| NO \|/, 'private memory flat in every process');
is($st, 0, "soak.pl passed ($secs s)");
done_testing;
