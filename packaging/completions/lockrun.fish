# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_lockrun_global_optspecs
    string join \n h/help V/version
end

function __fish_lockrun_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_lockrun_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_lockrun_using_subcommand
    set -l cmd (__fish_lockrun_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c lockrun -n "__fish_lockrun_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockrun -n "__fish_lockrun_needs_command" -s V -l version -d 'Print version'
complete -c lockrun -n "__fish_lockrun_needs_command" -f -a "run" -d 'Run COMMAND while holding the lock NAME (the default subcommand)'
complete -c lockrun -n "__fish_lockrun_needs_command" -f -a "status" -d 'Show who holds the lock NAME and how its last run ended (exit 0 held, 1 free, 125 error)'
complete -c lockrun -n "__fish_lockrun_needs_command" -f -a "release" -d 'Break the lock NAME whoever holds it (operator override; needs --force)'
complete -c lockrun -n "__fish_lockrun_needs_command" -f -a "list" -d 'List the locks under --key-prefix that are held or have a last run, one line each: holders, TTL left, last run (exit 0, 125 on error)'
complete -c lockrun -n "__fish_lockrun_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l url -d 'Backend URL: redis://[user:pass@]host:port[/db] (rediss:// for TLS; any node of a Redis Cluster, or several: redis+cluster://[user:pass@]host:port,host:port); redis+sentinel://[user:pass@]host:port[,...]/MASTER[/db] (rediss+sentinel:// for TLS; LOCKRUN_SENTINEL_PASSWORD if the Sentinels\' password is not the master\'s); postgres://[user[:pass]@]host[:port][,...]/db[?param=value&...] (or postgresql://; sslmode, sslrootcert, sslcert, sslkey, channel_binding as in libpq); etcd://[user@]host:port[,host:port...] (etcds:// for TLS); file:///ABSOLUTE/DIR (locks for this host only, one file per lock in DIR); zk://[user:pass@]host:port[,host:port...][/chroot]; mysql://[user[:pass]@]host[:port]/db[?param=value&...] (or mariadb://; ssl-mode, ssl-ca, ssl-cert, ssl-key as in the mysql client, table). Give 3 or 5 redis:// URLs (repeated --url, or comma-separated in LOCKRUN_URL) for a Redlock quorum over independent servers. Prefer LOCKRUN_URL for URLs with a password: argv is visible in `ps`.' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l password-file -d 'Read the backend password from this file (its first line, at most 4 KiB; overrides the URL\'s; a warning if group or others can read it). LOCKRUN_PASSWORD in the environment works too; the command gets neither' -r -F
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l key-prefix -d 'Namespace of the backend keys (NAME\'s key is PREFIX{NAME} on Redis, PostgreSQL and etcd); two different (prefix, name) pairs never share a key' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l slots -d 'A semaphore: up to N commands hold NAME at once, each in its own slot (0 to N-1, given to the command as LOCKRUN_SLOT). Every lockrun of one NAME must give the same N: a holder with another N makes the run fail (125)' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l pg-table -d 'PostgreSQL only: the lease table (TABLE or SCHEMA.TABLE), created if missing' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l log-format -d 'Log format on stderr' -r -f -a "text\t'`lockrun: <message>`'
json\t'One JSON object a line with `ts` (RFC 3339, microseconds), `level`, `event`, `lock`, `msg` and fields'"
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l ttl -d 'Lease length (humantime: 500ms, 30s, 5m, "1h 30m"), from 100ms to 24h' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l renew-every -d 'Renewal period, at least 10ms and shorter than the TTL [default: TTL/3]' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l wait -d 'How long to wait for a busy lock (0: do not wait), at most 365d' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l splay -d 'Before the first attempt, pause a uniformly random time from 0 to this, holding nothing, so that a fleet\'s hosts do not all try on the same tick (a signal ends the pause and lockrun; the command is not started). --wait counts after it. At most 24h' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l ping -d 'A dead man\'s switch in the healthchecks.io style: the run that holds the lock requests URL/start?rid=RID as the command starts and URL/STATUS?rid=RID when it ends (STATUS = lockrun\'s exit status). Busy and skipped runs ping nothing. A ping never delays the command nor changes the exit status; it gives up after about 10 s (https_proxy, http_proxy, no_proxy apply; LOCKRUN_TLS_CA adds a CA)' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l once-per -d 'Run only if no run of NAME that started within this long (by the backend\'s clock) succeeded, judged while holding the lock; else exit with the conflict status, the command not started. A failed run does not count. At most 7d; not on etcd or ZooKeeper yet' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l conflict-exit-code -d 'Exit status when the lock was not acquired' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l hold-at-least -d 'Keep the lock until this long after acquisition even if the command ends sooner (without keeping a process alive), so hosts with skewed clocks do not run the same cron tick again. At most 24h (it is stored as the lock\'s expiry)' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l kill-signal -d 'First signal sent to the process group when the lock is lost (TERM, INT, HUP, QUIT, USR1, USR2, KILL, or a number; SIG prefix optional). Signals that only stop or continue a process or are ignored by default (STOP, TSTP, TTIN, TTOU, CONT, CHLD, WINCH, URG) are refused' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l kill-after -d 'Escalate to SIGKILL this long after the kill signal or a signal forwarded to the command, or at the lease deadline, whichever comes first. At most 24h' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l max-runtime -d 'Stop the command (kill signal, then SIGKILL after --kill-after) once it has run this long (0: no limit), at most 365d' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l metrics-file -d 'After every run (ran, busy, lost or failed), atomically replace this file with Prometheus text-format gauges for node_exporter\'s textfile collector (use one file per lock, named *.prom)' -r -F
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -l allow-eviction -d 'Redis only: take the lock even on a server that may evict it (maxmemory set and a maxmemory-policy other than noeviction), which is otherwise refused (125). An evicted lock lets a second holder in; fencing tokens still tell them apart'
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -s q -l quiet -d 'Quieter: only errors'
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -s v -l verbose -d 'Louder: -v for each step of the run, -vv for every renewal'
complete -c lockrun -n "__fish_lockrun_using_subcommand run" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l url -d 'Backend URL: redis://[user:pass@]host:port[/db] (rediss:// for TLS; any node of a Redis Cluster, or several: redis+cluster://[user:pass@]host:port,host:port); redis+sentinel://[user:pass@]host:port[,...]/MASTER[/db] (rediss+sentinel:// for TLS; LOCKRUN_SENTINEL_PASSWORD if the Sentinels\' password is not the master\'s); postgres://[user[:pass]@]host[:port][,...]/db[?param=value&...] (or postgresql://; sslmode, sslrootcert, sslcert, sslkey, channel_binding as in libpq); etcd://[user@]host:port[,host:port...] (etcds:// for TLS); file:///ABSOLUTE/DIR (locks for this host only, one file per lock in DIR); zk://[user:pass@]host:port[,host:port...][/chroot]; mysql://[user[:pass]@]host[:port]/db[?param=value&...] (or mariadb://; ssl-mode, ssl-ca, ssl-cert, ssl-key as in the mysql client, table). Give 3 or 5 redis:// URLs (repeated --url, or comma-separated in LOCKRUN_URL) for a Redlock quorum over independent servers. Prefer LOCKRUN_URL for URLs with a password: argv is visible in `ps`.' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l password-file -d 'Read the backend password from this file (its first line, at most 4 KiB; overrides the URL\'s; a warning if group or others can read it). LOCKRUN_PASSWORD in the environment works too; the command gets neither' -r -F
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l key-prefix -d 'Namespace of the backend keys (NAME\'s key is PREFIX{NAME} on Redis, PostgreSQL and etcd); two different (prefix, name) pairs never share a key' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l slots -d 'A semaphore: up to N commands hold NAME at once, each in its own slot (0 to N-1, given to the command as LOCKRUN_SLOT). Every lockrun of one NAME must give the same N: a holder with another N makes the run fail (125)' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l pg-table -d 'PostgreSQL only: the lease table (TABLE or SCHEMA.TABLE), created if missing' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l log-format -d 'Log format on stderr' -r -f -a "text\t'`lockrun: <message>`'
json\t'One JSON object a line with `ts` (RFC 3339, microseconds), `level`, `event`, `lock`, `msg` and fields'"
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l allow-eviction -d 'Redis only: take the lock even on a server that may evict it (maxmemory set and a maxmemory-policy other than noeviction), which is otherwise refused (125). An evicted lock lets a second holder in; fencing tokens still tell them apart'
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -s q -l quiet -d 'Quieter: only errors'
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -s v -l verbose -d 'Louder: -v for each step of the run, -vv for every renewal'
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -l json -d 'Print one JSON object instead of a sentence'
complete -c lockrun -n "__fish_lockrun_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l url -d 'Backend URL: redis://[user:pass@]host:port[/db] (rediss:// for TLS; any node of a Redis Cluster, or several: redis+cluster://[user:pass@]host:port,host:port); redis+sentinel://[user:pass@]host:port[,...]/MASTER[/db] (rediss+sentinel:// for TLS; LOCKRUN_SENTINEL_PASSWORD if the Sentinels\' password is not the master\'s); postgres://[user[:pass]@]host[:port][,...]/db[?param=value&...] (or postgresql://; sslmode, sslrootcert, sslcert, sslkey, channel_binding as in libpq); etcd://[user@]host:port[,host:port...] (etcds:// for TLS); file:///ABSOLUTE/DIR (locks for this host only, one file per lock in DIR); zk://[user:pass@]host:port[,host:port...][/chroot]; mysql://[user[:pass]@]host[:port]/db[?param=value&...] (or mariadb://; ssl-mode, ssl-ca, ssl-cert, ssl-key as in the mysql client, table). Give 3 or 5 redis:// URLs (repeated --url, or comma-separated in LOCKRUN_URL) for a Redlock quorum over independent servers. Prefer LOCKRUN_URL for URLs with a password: argv is visible in `ps`.' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l password-file -d 'Read the backend password from this file (its first line, at most 4 KiB; overrides the URL\'s; a warning if group or others can read it). LOCKRUN_PASSWORD in the environment works too; the command gets neither' -r -F
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l key-prefix -d 'Namespace of the backend keys (NAME\'s key is PREFIX{NAME} on Redis, PostgreSQL and etcd); two different (prefix, name) pairs never share a key' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l slots -d 'A semaphore: up to N commands hold NAME at once, each in its own slot (0 to N-1, given to the command as LOCKRUN_SLOT). Every lockrun of one NAME must give the same N: a holder with another N makes the run fail (125)' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l pg-table -d 'PostgreSQL only: the lease table (TABLE or SCHEMA.TABLE), created if missing' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l log-format -d 'Log format on stderr' -r -f -a "text\t'`lockrun: <message>`'
json\t'One JSON object a line with `ts` (RFC 3339, microseconds), `level`, `event`, `lock`, `msg` and fields'"
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l allow-eviction -d 'Redis only: take the lock even on a server that may evict it (maxmemory set and a maxmemory-policy other than noeviction), which is otherwise refused (125). An evicted lock lets a second holder in; fencing tokens still tell them apart'
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -s q -l quiet -d 'Quieter: only errors'
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -s v -l verbose -d 'Louder: -v for each step of the run, -vv for every renewal'
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -l force -d 'Confirm that the lock is to be broken whoever holds it. The holder\'s command keeps running until its lockrun notices the loss (at its next renewal)'
complete -c lockrun -n "__fish_lockrun_using_subcommand release" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -l url -d 'Backend URL: redis://[user:pass@]host:port[/db] (rediss:// for TLS; any node of a Redis Cluster, or several: redis+cluster://[user:pass@]host:port,host:port); redis+sentinel://[user:pass@]host:port[,...]/MASTER[/db] (rediss+sentinel:// for TLS; LOCKRUN_SENTINEL_PASSWORD if the Sentinels\' password is not the master\'s); postgres://[user[:pass]@]host[:port][,...]/db[?param=value&...] (or postgresql://; sslmode, sslrootcert, sslcert, sslkey, channel_binding as in libpq); etcd://[user@]host:port[,host:port...] (etcds:// for TLS); file:///ABSOLUTE/DIR (locks for this host only, one file per lock in DIR); zk://[user:pass@]host:port[,host:port...][/chroot]; mysql://[user[:pass]@]host[:port]/db[?param=value&...] (or mariadb://; ssl-mode, ssl-ca, ssl-cert, ssl-key as in the mysql client, table). Give 3 or 5 redis:// URLs (repeated --url, or comma-separated in LOCKRUN_URL) for a Redlock quorum over independent servers. Prefer LOCKRUN_URL for URLs with a password: argv is visible in `ps`.' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -l password-file -d 'Read the backend password from this file (its first line, at most 4 KiB; overrides the URL\'s; a warning if group or others can read it). LOCKRUN_PASSWORD in the environment works too; the command gets neither' -r -F
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -l key-prefix -d 'Namespace of the backend keys (NAME\'s key is PREFIX{NAME} on Redis, PostgreSQL and etcd); two different (prefix, name) pairs never share a key' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -l slots -d 'A semaphore: up to N commands hold NAME at once, each in its own slot (0 to N-1, given to the command as LOCKRUN_SLOT). Every lockrun of one NAME must give the same N: a holder with another N makes the run fail (125)' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -l pg-table -d 'PostgreSQL only: the lease table (TABLE or SCHEMA.TABLE), created if missing' -r
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -l log-format -d 'Log format on stderr' -r -f -a "text\t'`lockrun: <message>`'
json\t'One JSON object a line with `ts` (RFC 3339, microseconds), `level`, `event`, `lock`, `msg` and fields'"
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -l allow-eviction -d 'Redis only: take the lock even on a server that may evict it (maxmemory set and a maxmemory-policy other than noeviction), which is otherwise refused (125). An evicted lock lets a second holder in; fencing tokens still tell them apart'
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -s q -l quiet -d 'Quieter: only errors'
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -s v -l verbose -d 'Louder: -v for each step of the run, -vv for every renewal'
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -l json -d 'Print a JSON array of `status --json` objects instead of lines'
complete -c lockrun -n "__fish_lockrun_using_subcommand list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c lockrun -n "__fish_lockrun_using_subcommand help; and not __fish_seen_subcommand_from run status release list help" -f -a "run" -d 'Run COMMAND while holding the lock NAME (the default subcommand)'
complete -c lockrun -n "__fish_lockrun_using_subcommand help; and not __fish_seen_subcommand_from run status release list help" -f -a "status" -d 'Show who holds the lock NAME and how its last run ended (exit 0 held, 1 free, 125 error)'
complete -c lockrun -n "__fish_lockrun_using_subcommand help; and not __fish_seen_subcommand_from run status release list help" -f -a "release" -d 'Break the lock NAME whoever holds it (operator override; needs --force)'
complete -c lockrun -n "__fish_lockrun_using_subcommand help; and not __fish_seen_subcommand_from run status release list help" -f -a "list" -d 'List the locks under --key-prefix that are held or have a last run, one line each: holders, TTL left, last run (exit 0, 125 on error)'
complete -c lockrun -n "__fish_lockrun_using_subcommand help; and not __fish_seen_subcommand_from run status release list help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
