//! What the soak's history is made of: what every critical section reported about
//! itself (over a TCP connection to the listener here, see `section.pl`), what the
//! nemesis did and when, and how each lockrun ended; and the whole history as text for
//! a person looking into a failure. All instants are `CLOCK_BOOTTIME`.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::check::History;
use crate::support::boottime;

/// One run of the critical section, as it reported itself.
#[derive(Clone, Debug, Default)]
pub struct Section {
    /// The fencing token it was given.
    pub fence: u64,
    /// The slot it was given (`LOCKRUN_SLOT`; 0 of a plain lock).
    pub slot: u32,
    /// Its lockrun's pid.
    pub lockrun_pid: i32,
    /// Its own pid, and its child's if it started one.
    pub pids: Vec<i32>,
    /// When it started.
    pub start: Duration,
    /// The latest instant it or a process of its job (its child) reported (start,
    /// heartbeat, write or end): its job was running then.
    pub last_seen: Duration,
    /// When it ended normally, if it did.
    pub end: Option<Duration>,
    /// When its connection closed: every process of its group was gone by then.
    pub gone: Option<Duration>,
    /// Its store writes: (sent at, accepted).
    pub writes: Vec<(Duration, bool)>,
    /// Lines it sent that made no sense (a bug in the test).
    pub garbage: Vec<String>,
}

impl Section {
    /// The end of what it did: the last instant it, or a process of its job, was seen
    /// running (its normal end, if nothing of the job ran on after it). The job's
    /// descendants are part of the holder: a section lasts until the last of them.
    pub fn until(&self) -> Duration {
        self.last_seen
    }
}

/// Listens for sections on a free port; every connection is one section.
pub struct Listener {
    port: u16,
    sections: Arc<Mutex<Vec<Arc<Mutex<Section>>>>>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Listener {
    /// Starts listening.
    pub fn start() -> Listener {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind history listener");
        let port = listener.local_addr().unwrap().port();
        let sections: Arc<Mutex<Vec<Arc<Mutex<Section>>>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (all, st) = (sections.clone(), stop.clone());
        let accept = thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let section = Arc::new(Mutex::new(Section::default()));
                all.lock().unwrap().push(section.clone());
                thread::spawn(move || {
                    let reader = BufReader::new(conn);
                    for line in reader.lines() {
                        let Ok(line) = line else { break };
                        take(&mut section.lock().unwrap(), &line);
                    }
                    section.lock().unwrap().gone = Some(boottime());
                });
            }
        });
        Listener {
            port,
            sections,
            stop,
            accept: Some(accept),
        }
    }

    /// The port sections report to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A copy of every section so far.
    pub fn sections(&self) -> Vec<Section> {
        self.sections
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.lock().unwrap().clone())
            .collect()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn ns(s: &str) -> Option<Duration> {
    s.parse::<u64>().ok().map(Duration::from_nanos)
}

fn take(s: &mut Section, line: &str) {
    let f: Vec<&str> = line.split(' ').collect();
    let seen = |s: &mut Section, t: Duration| s.last_seen = s.last_seen.max(t);
    match f.as_slice() {
        ["S", fence, lockrun, pid, t, slot] => {
            if let (Ok(fence), Ok(lr), Ok(pid), Some(t), Ok(slot)) = (
                fence.parse(),
                lockrun.parse(),
                pid.parse(),
                ns(t),
                slot.parse(),
            ) {
                s.fence = fence;
                s.slot = slot;
                s.lockrun_pid = lr;
                s.pids.push(pid);
                s.start = t;
                seen(s, t);
                return;
            }
        }
        ["H", t] => {
            if let Some(t) = ns(t) {
                seen(s, t);
                return;
            }
        }
        ["W", t, ok, _seq] => {
            if let Some(t) = ns(t) {
                s.writes.push((t, *ok == "1"));
                seen(s, t);
                return;
            }
        }
        ["C", pid] => {
            if let Ok(pid) = pid.parse() {
                s.pids.push(pid);
                return;
            }
        }
        ["E", t] => {
            if let Some(t) = ns(t) {
                s.end = Some(t);
                seen(s, t);
                return;
            }
        }
        _ => {}
    }
    s.garbage.push(line.to_owned());
}

/// What the nemesis did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// SIGSTOP of the lock's redis-server, SIGCONT at the end.
    FreezeRedis,
    /// SIGKILL of the redis-server and a restart with no data.
    RestartRedis,
    /// FLUSHALL.
    Flushall,
    /// The proxy swallows everything (both ways) for a while.
    Blackhole,
    /// The proxy closes every connection.
    Cut,
    /// The proxy closes every connection and refuses new ones for a while.
    Refuse,
    /// The proxy delays every reply for a while.
    Latency,
    /// The next acquire and every release (with what follows them on their
    /// connections) are stuck in the network for a while, then delivered late; other
    /// connections go through meanwhile.
    StuckRequests,
    /// SIGSTOP of one lockrun, SIGCONT at the end.
    PauseLockrun,
    /// The redis-server's wall clock jumps forward (as its keys see it: they expire
    /// that much sooner).
    ClockJump,
    /// SIGKILL of one lockrun (`kill -9`, the OOM killer): its job must die with it.
    KillLockrun,
    /// The holder's stderr a full pipe that nobody reads for a while: lockrun may lose
    /// lines, never a deadline.
    StderrBlocked,
    /// SIGSTOP of a holder's guard (issue 39): lockrun continues it at once; or lockrun
    /// stopped first, then its guard, then lockrun SIGKILLed (the kernel continues the
    /// guard, which kills the job).
    StopGuard,
}

impl Fault {
    /// Every kind, in report order.
    pub const ALL: [Fault; 13] = [
        Fault::FreezeRedis,
        Fault::RestartRedis,
        Fault::Flushall,
        Fault::Blackhole,
        Fault::Cut,
        Fault::Refuse,
        Fault::Latency,
        Fault::StuckRequests,
        Fault::PauseLockrun,
        Fault::ClockJump,
        Fault::KillLockrun,
        Fault::StderrBlocked,
        Fault::StopGuard,
    ];

    /// A short name for the report.
    pub fn name(self) -> &'static str {
        match self {
            Fault::FreezeRedis => "freeze",
            Fault::RestartRedis => "restart",
            Fault::Flushall => "flushall",
            Fault::Blackhole => "blackhole",
            Fault::Cut => "cut",
            Fault::Refuse => "refuse",
            Fault::Latency => "latency",
            Fault::StuckRequests => "stuck-requests",
            Fault::PauseLockrun => "pause-lockrun",
            Fault::ClockJump => "clock-jump",
            Fault::KillLockrun => "kill-lockrun",
            Fault::StderrBlocked => "stderr-blocked",
            Fault::StopGuard => "stop-guard",
        }
    }

    /// True for the faults under which two holders may overlap: the lease a holder
    /// relies on vanishes on the server (data loss, an early expiry) or the holder
    /// cannot act on its own deadline (paused). Fencing is the answer to those. A
    /// killed lockrun or a blocked stderr explains nothing: the job dies with lockrun,
    /// and no log line may hold up a kill.
    pub fn may_overlap(self) -> bool {
        match self {
            Fault::RestartRedis | Fault::Flushall | Fault::PauseLockrun | Fault::ClockJump => true,
            Fault::FreezeRedis
            | Fault::Blackhole
            | Fault::Cut
            | Fault::Refuse
            | Fault::Latency
            | Fault::StuckRequests
            | Fault::KillLockrun
            | Fault::StderrBlocked
            | Fault::StopGuard => false,
        }
    }
}

/// One fault, from the moment it was applied to the moment it was healed (both taken on
/// the safe side: just before applying, just after healing).
#[derive(Clone, Debug)]
pub struct FaultEvent {
    /// What.
    pub kind: Fault,
    /// Applied at.
    pub from: Duration,
    /// Healed at (equal to `from` for instant faults).
    pub to: Duration,
    /// The lockrun paused, killed, whose stderr was blocked or whose guard was stopped.
    pub pid: Option<i32>,
    /// A few words for the report (duration, offset).
    pub detail: String,
}

/// How one lockrun ended.
#[derive(Clone, Debug)]
pub struct Run {
    /// Its pid.
    pub pid: i32,
    /// Seen ended at.
    pub ended: Duration,
    /// Its exit code (`None`: killed by a signal, which must not happen unless the
    /// nemesis killed it).
    pub code: Option<i32>,
    /// Its stderr (JSON lines; what it wrote while its stderr was blocked may be lost).
    pub stderr: String,
    /// True when the test had to kill it (it hung).
    pub hung: bool,
}

/// The whole history as text (all instants in ms of CLOCK_BOOTTIME), for a person
/// looking into a failure.
pub fn describe(h: &History<'_>) -> String {
    let ms = |d: Duration| d.as_millis();
    let mut out = String::from("# faults: kind from to pid detail\n");
    for f in h.faults {
        let (kind, from, to) = (f.kind.name(), ms(f.from), ms(f.to));
        out += &format!("{kind} {from} {to} {:?} {}\n", f.pid, f.detail);
    }
    out += "\n# sections: fence slot lockrun start until gone writes(t:ok)\n";
    let mut sections: Vec<_> = h.sections.iter().collect();
    sections.sort_by_key(|s| s.start);
    for s in sections {
        let writes: Vec<String> = s
            .writes
            .iter()
            .map(|(t, ok)| format!("{}:{}", ms(*t), u8::from(*ok)))
            .collect();
        let (start, until, gone) = (ms(s.start), ms(s.until()), s.gone.map(ms));
        out += &format!(
            "{} {} {} {start} {until} {gone:?} {}\n",
            s.fence,
            s.slot,
            s.lockrun_pid,
            writes.join(",")
        );
    }
    out += "\n# tap: call token sent replied delivered reply\n";
    for r in h.records {
        let (sent, replied) = (ms(r.sent), r.replied.map(ms));
        out += &format!(
            "{:?} {} {sent} {replied:?} {} {:?}\n",
            r.call, r.token, r.delivered, r.reply
        );
    }
    out += "\n# runs: pid ended code, then the log\n";
    for r in h.runs {
        out += &format!("## {} {} {:?}\n{}\n", r.pid, ms(r.ended), r.code, r.stderr);
    }
    out
}
