//! The fuzz's case generator: a seeded PRNG and random mutations of valid `lockrun run`
//! command lines. Each pool of values is one `|`-separated string (an empty field is
//! the empty string), and mixes valid values with odd ones.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::time::Duration;

use lockrun::config::bounds;

/// SplitMix64: small, seeded, good enough to pick test cases.
pub struct Rng(pub u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub(super) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One field of a `|`-separated pool.
    fn pick(&mut self, pool: &'static str) -> &'static str {
        let fields: Vec<&'static str> = pool.split('|').collect();
        fields[self.below(fields.len() as u64) as usize]
    }
}

const PLAIN_DURATIONS: &str = "0|10ms|100ms|1s|30s|5m|1h 30m|24h|365d";
const ODD_DURATIONS: &str = "| |0|500000000000y|18446744073709551615s|1e3s|0x10s|١s|5s5|--|ms|\
                             1.5s|NaN|inf|1h 30m 5x";
const UNITS: &str = "ns|us|ms|s|m|h|d|w|M|y|years|x|| s";
const SIGNALS: &str = "TERM|INT|HUP|QUIT|USR1|USR2|KILL|STOP|TSTP|TTIN|TTOU|CONT|CHLD|WINCH|\
                       URG|sigterm|SIG||ALRM|PIPE|RTMIN";
const USABLE_SIGNALS: &str = "TERM|INT|HUP|QUIT|USR1|USR2|KILL";
const ODD_PORTS: &str = "0|00|65536|-1|+1|x|99999999999";
const SCHEMES: &str = "redis|rediss|redis+sentinel|postgres|postgresql|etcd|http||REDIS|\
                       redis+cluster";
const USERINFO: &str = "|u@|:s3cret@|u:s3cret@|u:p@s3cret@|%zz@|@@";
/// Hosts the binary may be given: none needs a name server.
const QUICK_HOSTS: &str = "127.0.0.1|[::1]|localhost|h o|%";
const ANY_HOSTS: &str = "127.0.0.1|[::1]|localhost||h o|ünï|a,b|h:1:2";
const PATHS: &str = "|/|/0|/db|/m|/m/2|/x/y/z|/db?sslmode=disable|/db?port=0|\
                     /db?sslmode=bogus|/99999999999";
const BROKEN_URLS: &str = "|://|redis://|redis:/h:1|x";
const BAD_NAMES: &str = "|has space|ünï|a\nb|-x|status|{x}";
const NAMES: &str = "job|a/b:c-d.e_f|run";
const OPTIONS: &str = "--url|--ttl|--renew-every|--wait|--hold-at-least|--kill-signal|\
                       --kill-after|--max-runtime|--conflict-exit-code|--key-prefix|-q|-v|-vv|\
                       --log-format|--pg-table|--password-file";
const GARBAGE: &str = "-|--|-x|--ttl|=|--url=|--wait|run|help";

/// Where the backend is: a port where nothing listens, and maybe a live Redis. Only
/// addresses that answer at once (no name to resolve, no server of anyone else's).
pub struct Target {
    /// `127.0.0.1:PORT`, refusing connections.
    pub closed: String,
    /// The URL of the test's own Redis, if the cases may use one.
    pub live: Option<String>,
}

/// Makes cases; `binary` keeps them quick and harmless to run for real.
pub struct Gen<'a> {
    /// The randomness.
    pub rng: Rng,
    /// The backend addresses.
    pub target: &'a Target,
    /// The cases are for the binary.
    pub binary: bool,
}

impl Gen<'_> {
    fn number(&mut self) -> String {
        match self.rng.below(6) {
            0 => u64::MAX.to_string(),
            1 => "99999999999999999999999999".into(),
            2 => "0".into(),
            3 => format!("-{}", self.rng.below(100)),
            4 => self.rng.next().to_string(),
            _ => self.rng.below(1000).to_string(),
        }
    }

    fn duration(&mut self) -> String {
        if self.rng.chance(60) {
            return self.rng.pick(PLAIN_DURATIONS).into();
        }
        match self.rng.below(6) {
            0 | 1 => self.rng.pick(ODD_DURATIONS).into(),
            2 => {
                let (a, unit, b) = (self.number(), self.rng.pick(UNITS), self.number());
                format!("{a}{unit} {b}ms")
            }
            _ => format!("{}{}", self.number(), self.rng.pick(UNITS)),
        }
    }

    fn signal(&mut self) -> String {
        match self.rng.below(4) {
            0 => self.number(),
            1 => self.rng.pick(SIGNALS).into(),
            _ => self.rng.pick(USABLE_SIGNALS).into(),
        }
    }

    fn port(&mut self) -> String {
        let closed = self.target.closed.rsplit(':').next().unwrap_or("1");
        match self.rng.below(3) {
            0 => self.rng.pick(ODD_PORTS).into(),
            _ => closed.to_owned(),
        }
    }

    fn url(&mut self) -> String {
        if let Some(live) = self.target.live.clone().filter(|_| self.rng.chance(30)) {
            return live;
        }
        let closed = &self.target.closed;
        if self.rng.chance(50) {
            let secret = self.rng.chance(30);
            let pw = if secret { ":s3cret@" } else { "" };
            return match self.rng.below(5) {
                0 => format!("redis://{pw}{closed}"),
                1 => format!("rediss://{pw}{closed}/1"),
                2 => format!("redis+sentinel://{pw}{closed}/m"),
                3 if secret => format!("postgres://u:s3cret@{closed}/db"),
                3 => format!("postgres://u@{closed}/db"),
                _ => format!("etcd://{closed}"),
            };
        }
        let hosts = if self.binary { QUICK_HOSTS } else { ANY_HOSTS };
        let scheme = self.rng.pick(SCHEMES);
        let mut hostports = vec![];
        for _ in 0..=self.rng.below(3) {
            hostports.push(format!("{}:{}", self.rng.pick(hosts), self.port()));
        }
        let (userinfo, path) = (self.rng.pick(USERINFO), self.rng.pick(PATHS));
        if !self.binary && self.rng.chance(10) {
            return self.rng.pick(BROKEN_URLS).into();
        }
        format!("{scheme}://{userinfo}{}{path}", hostports.join(","))
    }

    fn name(&mut self) -> OsString {
        match self.rng.below(20) {
            0 => OsString::from_vec(vec![b'j', 0xff, b'b']),
            1 if !self.binary => OsString::from("a\0b"),
            2 | 4 => self.rng.pick(BAD_NAMES).into(),
            3 => "x".repeat(200 + self.rng.below(2) as usize).into(),
            _ => self.rng.pick(NAMES).into(),
        }
    }

    /// An option and its value, or `None` for a flag.
    fn option(&mut self) -> (&'static str, Option<String>) {
        let option = self.rng.pick(OPTIONS);
        let value = match option {
            "--url" => self.url(),
            "--kill-signal" => self.signal(),
            "--conflict-exit-code" if self.rng.chance(30) => self.number(),
            "--conflict-exit-code" => self.rng.below(256).to_string(),
            "--key-prefix" => self.rng.pick("lockrun:||{|a b|ünï:").into(),
            "--log-format" => self.rng.pick("text|json|json|json|xml").into(),
            "--pg-table" => self.rng.pick("lockrun_locks|x;y|a.b.c|").into(),
            "--password-file" => self.rng.pick("/nonexistent/pw|/dev/null|/dev/null").into(),
            "--wait" if self.binary => self.quick_wait(),
            "-q" | "-v" | "-vv" => return (option, None),
            _ => self.duration(),
        };
        (option, Some(value))
    }

    /// A `--wait` for the binary: anything, but never a valid wait over 100 ms (the
    /// backend is down or busy: the run would last the whole wait).
    fn quick_wait(&mut self) -> String {
        let d = self.duration();
        match bounds::WAIT.parse(&d) {
            Ok(w) if w > Duration::from_millis(100) => "100ms".into(),
            _ => d,
        }
    }

    /// A command line, program name first; the command is one whose exit status is
    /// known (0, 1, 3, 126 or 127).
    pub fn case(&mut self) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec!["lockrun".into()];
        if self.rng.chance(50) {
            argv.push("run".into());
        }
        // An option first: a name in first position could be taken for a subcommand.
        argv.push("--url".into());
        argv.push(self.url().into());
        let mut given = vec![];
        for _ in 0..self.rng.below(5) {
            let (option, value) = self.option();
            // Repeated options are refused by clap: now and then is enough.
            if given.contains(&option) && option != "--url" && !self.rng.chance(10) {
                continue;
            }
            given.push(option);
            match value {
                Some(v) if self.rng.chance(20) => argv.push(format!("{option}={v}").into()),
                Some(v) => argv.extend([option.into(), v.into()]),
                None => argv.push(option.into()),
            }
        }
        argv.push(self.name());
        argv.push("--".into());
        let command = self
            .rng
            .pick("true|false|sh -c exit_3|/nonexistent/command|/");
        argv.extend(command.split(' ').map(|a| a.replace('_', " ").into()));
        self.mutate(&mut argv);
        argv
    }

    /// Now and then, breaks the command line: a token dropped, repeated, swapped or
    /// replaced by garbage. Never `lockrun` itself, the first argument or the command
    /// after `--` (its exit status is its own); `--` may go, which leaves no command.
    fn mutate(&mut self, argv: &mut Vec<OsString>) {
        let Some(dd) = argv.iter().rposition(|a| a == "--") else {
            return;
        };
        if dd < 3 || !self.rng.chance(20) {
            return;
        }
        let at = 2 + self.rng.below(dd as u64 - 1) as usize;
        let other = 2 + self.rng.below(dd as u64 - 2) as usize;
        match self.rng.below(4) {
            0 => {
                argv.remove(at);
            }
            1 => argv.insert(at, argv[at].clone()),
            2 => argv.swap(at.min(dd - 1), other),
            _ => argv[at] = self.rng.pick(GARBAGE).into(),
        }
    }
}
