# The critical section of the soak: run by lockrun as `perl -e`, with the fencing token
# in LOCKRUN_FENCING_TOKEN and its slot in LOCKRUN_SLOT. It reports to the test's history
# listener (SOAK_HARNESS, a TCP port) and writes to the fenced store (SOAK_STORE, a
# redis-server of its own, with the compare-and-set script SOAK_SHA), to the resource of
# its slot (the store keeps one high watermark per slot). Every instant is CLOCK_BOOTTIME
# in ns, the clock the test and lockrun use. Lines sent:
#   S <fencing token> <lockrun pid> <pid> <t> <slot>   started
#   W <t> <1 accepted|0 rejected> <seq>                a store write, sent at t
#   H <t>                                              still running at t (every 10 ms)
#   C <pid>                                            a child that outlives it runs
#   E <t>                                              ended normally
# The child (SOAK_CHILD: `group`, in the command's group; `setsid`, in a session of its
# own; `orphan`, an orphan of a double fork) sends heartbeats (H) too: the section lasts
# until the last process of its job is gone. The listener sees EOF when the last
# process holding the socket (this one or its child) is gone: that is when the job died.
use strict;
use warnings;
use POSIX ();
use IO::Socket::INET;
use Time::HiRes qw(clock_gettime CLOCK_BOOTTIME);

sub now { sprintf("%.0f", clock_gettime(CLOCK_BOOTTIME) * 1e9) }
my $t0 = now();
my $tok = $ENV{LOCKRUN_FENCING_TOKEN};
# Not a number without LOCKRUN_SLOT: the test then finds the S line garbled.
my $slot = $ENV{LOCKRUN_SLOT} // 'none';
$SIG{TERM} = $ENV{SOAK_TERM} eq 'ignore' ? 'IGNORE' : 'DEFAULT';
$SIG{__WARN__} = sub { };
my $h = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$ENV{SOAK_HARNESS}", Proto => 'tcp')
  or exit 90;
sub report { syswrite($h, "$_[0]\n") }
# lockrun starts the command through its guard (`lockrun-guard`, lockrun's child): the
# lockrun is the guard's parent.
sub lockrun_pid {
  my $pp = getppid();
  open(my $c, '<', "/proc/$pp/comm") or return $pp;
  my $comm = <$c> // '';
  chomp $comm;
  return $pp unless $comm eq 'lockrun-guard';
  open(my $s, '<', "/proc/$pp/stat") or return $pp;
  my $stat = <$s> // '';
  $stat =~ s/^.*\) //;
  my @f = split / /, $stat;
  return $f[1] // $pp;
}
report("S $tok " . lockrun_pid() . " $$ $t0 $slot");
my $st = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$ENV{SOAK_STORE}", Proto => 'tcp')
  or exit 91;
$st->autoflush(1);

sub resp {
  my $s = "*" . scalar(@_) . "\r\n";
  $s .= "\$" . length($_) . "\r\n$_\r\n" for @_;
  $s;
}
my $seq = 0;
sub store_write {
  my $t = now();
  print $st resp("EVALSHA", $ENV{SOAK_SHA}, 2, "high:$slot", "log", $tok, "$tok $slot $$ $seq $t");
  my $line = <$st>;
  exit 92 unless defined $line;
  report("W $t " . ($line =~ /^:1/ ? 1 : 0) . " $seq");
  $seq++;
}

if ($ENV{SOAK_CHILD}) {
  my $pid = fork();
  if (defined $pid && $pid == 0) {
    # A leftover that outlives the section: lockrun must stop it before releasing, and
    # kill it with the rest of the job if lockrun is killed.
    $SIG{TERM} = 'DEFAULT';
    close($st);
    POSIX::setsid() if $ENV{SOAK_CHILD} eq 'setsid';
    if ($ENV{SOAK_CHILD} eq 'orphan') { my $p = fork(); POSIX::_exit(0) if !defined $p || $p; }
    report("C $$");
    while (1) {
      select(undef, undef, undef, 0.02);
      report("H " . now());
    }
  }
}

store_write();
my $until = clock_gettime(CLOCK_BOOTTIME) + $ENV{SOAK_HOLD_MS} / 1000;
my $i = 0;
while (clock_gettime(CLOCK_BOOTTIME) < $until) {
  select(undef, undef, undef, 0.01);
  report("H " . now());
  store_write() if ++$i % 8 == 0;
}
store_write();
report("E " . now());
exit 0;
